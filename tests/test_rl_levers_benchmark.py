"""benchmarks/rl_levers.py: variant minus SFT start, pooled over seeds, from rl_steps.py's evaluation files."""

from __future__ import annotations

import json

import pytest

from _benchmarks import load_benchmark


def _write_seed(run_dir, seed, outcomes, instances):
    """eval_seed<seed>/results.json with one greedy row per (configuration, stage) of ``outcomes``."""
    rows = [
        {
            "configuration": name,
            "stage": stage,
            "decoding": "greedy",
            "outcomes": values,
            "instances": instances,
            "success_rate": sum(values) / len(values),
        }
        for (name, stage), values in outcomes.items()
    ]
    folder = run_dir / f"eval_seed{seed}"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"results": rows}))


def test_the_table_pools_the_seeds_against_the_sft_start(tmp_path):
    bench = load_benchmark("rl_levers")
    run = tmp_path / "mix"
    instances = ["a", "b", "c", "d"]
    # seed 0: the variant wins instance a (+25 points), seed 1: it loses b and c (-50); the recipe equals SFT
    _write_seed(
        run,
        0,
        {("sft", "full"): [0, 1, 0, 1], ("rl", "full"): [0, 1, 0, 1], ("mix", "full"): [1, 1, 0, 1]},
        instances,
    )
    _write_seed(
        run,
        1,
        {("sft", "full"): [0, 1, 1, 0], ("rl", "full"): [0, 1, 1, 0], ("mix", "full"): [0, 0, 0, 0]},
        instances,
    )
    seeds = bench.load_seeds(run)
    d = bench.difference(seeds, "mix", "full")
    assert d["diff"] == pytest.approx((1 - 2) / 8 * 100)  # pooled over the 8 episodes
    assert d["per_seed"] == pytest.approx([25.0, -50.0])
    assert d["ci_low"] <= d["diff"] <= d["ci_high"]
    assert bench.difference(seeds, "rl", "full") == {
        "diff": 0.0,
        "ci_low": 0.0,
        "ci_high": 0.0,
        "per_seed": [0.0, 0.0],
    }
    table = bench.lever_table({"mix": run}, stages=("full",))
    assert table.splitlines()[2].startswith("| the recipe | +0.0 [+0.0, +0.0] (+0 / +0) |")
    assert table.splitlines()[3].startswith("| mix | -12.5 [")
    assert table.splitlines()[3].endswith("(+25 / -50) |")


def test_missing_or_mismatched_evaluations_are_named(tmp_path):
    bench = load_benchmark("rl_levers")
    with pytest.raises(FileNotFoundError, match="no eval_seed"):
        bench.load_seeds(tmp_path)
    run = tmp_path / "v"
    _write_seed(run, 0, {("sft", "full"): [0, 1], ("v", "full"): [1, 1]}, ["a", "b"])
    with pytest.raises(KeyError, match="seed 0: no greedy 'v' row for stage 'dropoff'"):
        bench.difference(bench.load_seeds(run), "v", "dropoff")
    with pytest.raises(SystemExit):
        bench.main(["--runs", "no-equals-sign"])
