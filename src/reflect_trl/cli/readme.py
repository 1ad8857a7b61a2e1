"""``reflect-trl readme``: the README's results blocks rendered from their committed summaries
(:mod:`reflect_trl.pipelines.readme_tables`)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from reflect_trl.pipelines.readme_tables import BLOCK, render_readme, stale_blocks


def readme_cli(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="reflect-trl readme",
        description="Render the README's results blocks from their committed summary.json files.",
    )
    parser.add_argument("--readme", default="README.md", help="the file to render (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when a block is stale")
    args = parser.parse_args(argv)
    path = Path(args.readme)
    text = path.read_text()
    root = path.parent
    if not BLOCK.search(text):
        parser.error(
            f"{path}: no '<!-- results: <summary.json> table|comparisons|naming [key=value ...] -->' block"
        )
    stale = stale_blocks(text, root)
    if args.check:
        for block in stale:
            print(f"{path}: the block '{block}' differs from its summary; run `make readme`")
        if stale:
            raise SystemExit(1)
        print(f"{path}: every results block matches its summary")
        return
    path.write_text(render_readme(text, root))
    print(f"{path}: {len(stale)} block(s) re-rendered" if stale else f"{path}: every block up to date")
