"""Test helpers: installed-looking distributions with entry points, written to a directory (no pip install).

``importlib.metadata`` finds a ``<name>-<version>.dist-info`` directory (``METADATA`` + ``entry_points.txt``) on any
``sys.path`` entry, exactly as it finds one that ``pip install`` wrote to site-packages.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "lock_puzzle"
EXAMPLE_SRC = EXAMPLE / "src"


def example_entry_points() -> dict[str, dict[str, str]]:
    """The entry points that ``examples/lock_puzzle/pyproject.toml`` declares (what pip would install)."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    return project["entry-points"]


def write_distribution(
    root: Path, name: str, entry_points: Mapping[str, Mapping[str, str]], version: str = "0.1.0"
) -> Path:
    """Write the metadata of distribution ``name`` with ``{group: {entry name: "module:attr"}}`` under ``root``."""
    dist_info = Path(root) / f"{re.sub(r'[-.]+', '_', name)}-{version}.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = []
    for group, entries in entry_points.items():
        lines.append(f"[{group}]")
        lines += [f"{entry} = {target}" for entry, target in entries.items()]
        lines.append("")
    (dist_info / "entry_points.txt").write_text("\n".join(lines))
    return dist_info
