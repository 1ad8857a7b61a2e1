"""Import a script of ``benchmarks/`` as a module (the scripts are not part of the installed package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py``, loaded once and registered in ``sys.modules`` under ``name``."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def demo_seed_dir(tmp_path: Path, seed: int):
    """A seed folder as `make reproduce` leaves it, as far as the benchmarks read it (``demo_config.json``); returns
    the folder and its :class:`~reflect_trl.pipelines.demo.DemoConfig`."""
    import json
    from dataclasses import asdict

    from reflect_trl.pipelines.demo import DemoConfig

    seed_dir = tmp_path / f"seed_{seed}"
    seed_dir.mkdir()
    cfg = DemoConfig(seed=seed, output_dir=str(seed_dir))
    (seed_dir / "demo_config.json").write_text(json.dumps(asdict(cfg)))
    return seed_dir, cfg
