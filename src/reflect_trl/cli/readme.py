"""``reflect-trl readme``: the results blocks of the README and of the results page rendered from their committed
summaries (:mod:`reflect_trl.pipelines.readme_tables`)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from reflect_trl.pipelines.readme_tables import BLOCK, render_readme, stale_blocks

#: The files whose results blocks ``make readme`` renders: the product page and the full results page.
RESULTS_PAGES = ("README.md", "docs/results/README.md")


def readme_cli(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="reflect-trl readme",
        description="Render the results blocks of Markdown files from their committed summary.json files.",
    )
    parser.add_argument(
        "--readme",
        nargs="+",
        default=list(RESULTS_PAGES),
        help="the files to render, each block's summary path relative to its file (default: %(default)s)",
    )
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when a block is stale")
    args = parser.parse_args(argv)
    stale_any = False
    for name in args.readme:
        path = Path(name)
        try:
            text = path.read_text()
        except OSError as err:
            parser.error(f"{path}: cannot read it ({err.strerror})")
        if not BLOCK.search(text):
            parser.error(
                f"{path}: no '<!-- results: <summary.json> table|comparisons|naming [key=value ...] -->' block"
            )
        stale = stale_blocks(text, path.parent)
        stale_any = stale_any or bool(stale)
        if args.check:
            for block in stale:
                print(f"{path}: the block '{block}' differs from its summary; run `make readme`")
            if not stale:
                print(f"{path}: every results block matches its summary")
            continue
        path.write_text(render_readme(text, path.parent))
        print(f"{path}: {len(stale)} block(s) re-rendered" if stale else f"{path}: every block up to date")
    if args.check and stale_any:
        raise SystemExit(1)
