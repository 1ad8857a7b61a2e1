"""RL variants of `benchmarks/rl_steps.py` side by side: each variant's greedy `validation` success minus its SFT
start's, pooled over the seeds, with the 95 % paired bootstrap interval over problem instances stratified by seed
(``reflect_trl.reproduce.paired_bootstrap_difference``, as `make reproduce` compares its configurations), each seed's
difference in parentheses. A run folder is an ``rl_steps.py --output_dir``; its ``eval_seed<s>/results.json`` hold
the seed's SFT start (``sft``), the recipe's RL (``rl``) and the variant (``--name``) on the same episodes:

    .venv/bin/python benchmarks/rl_levers.py --runs unscaled=outputs/bench/rl_unscaled_val \\
        replay=outputs/bench/rl_replay_val anchor1=outputs/bench/rl_anchor_val ... --output levers.md

The recipe's row (``rl``) is read from the first folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from reflect_trl.reproduce import paired_bootstrap_difference  # noqa: E402

BASELINE = "sft"


def load_seeds(run_dir: Path) -> dict[int, dict[tuple[str, str], Mapping[str, Any]]]:
    """``{seed: {(configuration, stage): result row}}`` of a run folder's greedy evaluations."""
    seeds = {}
    for path in sorted(run_dir.glob("eval_seed*/results.json")):
        seed = int(path.parent.name.removeprefix("eval_seed"))
        rows = json.loads(path.read_text())["results"]
        seeds[seed] = {(r["configuration"], r["stage"]): r for r in rows if r["decoding"] == "greedy"}
    if not seeds:
        raise FileNotFoundError(f"{run_dir}: no eval_seed*/results.json (run benchmarks/rl_steps.py first)")
    return seeds


def difference(
    seeds: Mapping[int, Mapping[tuple[str, str], Mapping[str, Any]]], configuration: str, stage: str
) -> dict[str, Any]:
    """``configuration`` minus the SFT start on ``stage``: pooled point, interval and per-seed differences (points)."""
    order = sorted(seeds)
    for seed in order:
        for name in (configuration, BASELINE):
            if (name, stage) not in seeds[seed]:
                raise KeyError(f"seed {seed}: no greedy {name!r} row for stage {stage!r}")
    a = [seeds[s][(configuration, stage)] for s in order]
    b = [seeds[s][(BASELINE, stage)] for s in order]
    for x, y, s in zip(a, b, order, strict=True):
        if x["instances"] != y["instances"]:
            raise ValueError(f"seed {s}, {stage}: {configuration!r} and {BASELINE!r} played different tasks")
    point, low, high = paired_bootstrap_difference(
        [x["outcomes"] for x in a], [y["outcomes"] for y in b], instances=[x["instances"] for x in a]
    )
    per_seed = [100 * (x["success_rate"] - y["success_rate"]) for x, y in zip(a, b, strict=True)]
    return {"diff": 100 * point, "ci_low": 100 * low, "ci_high": 100 * high, "per_seed": per_seed}


def lever_table(runs: Mapping[str, Path], stages: Sequence[str] = ("pickup", "dropoff", "full")) -> str:
    """A markdown table: one row per variant (and the recipe's ``rl``), one column per stage."""
    loaded = {name: load_seeds(Path(path)) for name, path in runs.items()}
    rows = [("rl", next(iter(loaded.values())))] + list(loaded.items())
    lines = [
        f"| RL variant − SFT start (points) | {' | '.join(stages)} |",
        "|---|" + "---|" * len(stages),
    ]
    for name, seeds in rows:
        cells = []
        for stage in stages:
            d = difference(seeds, name, stage)
            spread = " / ".join(f"{x:+.0f}" for x in d["per_seed"])
            cells.append(f"{d['diff']:+.1f} [{d['ci_low']:+.1f}, {d['ci_high']:+.1f}] ({spread})")
        lines.append(f"| {'the recipe' if name == 'rl' else name} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", nargs="+", required=True, help="name=folder of an rl_steps.py run, one per variant"
    )
    parser.add_argument("--output", default=None, help="also write the table here")
    args = parser.parse_args(argv)
    runs = {}
    for item in args.runs:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            parser.error(f"--runs: {item!r} is not name=folder")
        runs[name] = Path(path)
    table = lever_table(runs)
    print(table, end="")
    if args.output:
        Path(args.output).write_text(table)
    return table


if __name__ == "__main__":
    main()
