"""examples/lock_puzzle end to end from its recipes, in smoke mode: build-tiny -> data -> sft (reflection, policy,
plain) -> rl (with and without reflection) -> eval, through the real ``reflect-trl`` command dispatch.

The environment is found only through its entry point (a ``*.dist-info`` written to tmp_path, as
``pip install ./examples/lock_puzzle`` would); the recipes run unchanged from a working directory in tmp_path,
with command-line overrides that shrink every step (nano model, a few tasks, a handful of steps).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from _plugins import EXAMPLE, EXAMPLE_SRC, example_entry_points, write_distribution
from reflect_trl.cli import main as reflect_trl

RECIPES = EXAMPLE / "recipes"
RECIPE_NAMES = ("data", "sft_reflection", "sft_policy", "sft_plain", "rl", "eval")
SMOKE_SFT = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--logging_steps", "1"]
SMOKE_RL = [
    *("--max_steps", "3", "--per_device_train_batch_size", "4", "--num_generations", "2"),
    *("--num_iterations", "1", "--reflection_max_new_tokens", "8", "--num_train_tasks", "3"),
]


def recipe(name: str) -> str:
    return str(RECIPES / f"{name}.yaml")


def test_the_example_ships_every_recipe():
    assert sorted(p.stem for p in RECIPES.glob("*.yaml")) == sorted(RECIPE_NAMES)
    for name in RECIPE_NAMES:
        assert yaml.safe_load(Path(recipe(name)).read_text())["env_name"] == "lock_puzzle"


@pytest.fixture
def lock_puzzle_installed(tmp_path, monkeypatch):
    """The example as pip would install it (its entry points), and a working directory for the recipes."""
    from reflect_trl.envs import entry_points

    site = tmp_path / "site"
    write_distribution(site, "reflect-lock-puzzle", example_entry_points())
    monkeypatch.syspath_prepend(str(EXAMPLE_SRC))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(entry_points, "_WARNED", set())
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def test_lock_puzzle_data_sft_rl_eval_from_the_recipes(lock_puzzle_installed):
    work = lock_puzzle_installed
    steps = [
        ["build-tiny", "--output_dir", "models/tiny-llama-lock", "--arch", "llama", "--preset", "nano"]
        + ["--envs", "lock_puzzle"],
        [
            "data",
            "--config",
            recipe("data"),
            *("--n_train_tasks", "3", "--n_val_tasks", "2", "--progress", "false"),
        ],
        ["sft", "--config", recipe("sft_reflection"), *SMOKE_SFT, "--eval_num_reflection_samples", "4"]
        + ["--reflection_max_new_tokens", "8"],
        ["sft", "--config", recipe("sft_policy"), *SMOKE_SFT, "--eval_num_policy_samples", "8"],
        ["sft", "--config", recipe("sft_plain"), *SMOKE_SFT, "--eval_num_policy_samples", "8"],
        ["rl", "--config", recipe("rl"), *SMOKE_RL],
        ["rl", "--config", recipe("rl"), *SMOKE_RL, "--model_name_or_path", "outputs/sft_plain"]
        + ["--reflection_model_name_or_path", "none", "--output_dir", "outputs/rl_plain"],
        ["eval", "--config", recipe("eval"), "--episodes_per_stage", "2", "--reflection_max_new_tokens", "8"],
    ]
    for argv in steps:
        assert reflect_trl(argv) == 0, argv

    tiny = json.loads((work / "models/tiny-llama-lock/reflect_trl_tiny.json").read_text())
    assert tiny["envs"] == ["lock_puzzle"]
    data = work / "data" / "lock_puzzle"
    for name in ("reflection", "policy_reflect", "policy_plain"):
        rows = [json.loads(line) for line in (data / f"{name}.jsonl").read_text().splitlines()]
        assert rows and {r["env"] for r in rows} == {"lock_puzzle"}
        assert {r["difficulty"] for r in rows} == {"one_dial", "two_dials", "three_dials"}
    assert "lock_puzzle" in (data / "README.md").read_text()
    for run in ("sft_reflection", "sft_policy", "sft_plain"):
        metrics = json.loads((work / "outputs" / run / "sft_metrics.json").read_text())
        assert (work / "outputs" / run / "config.json").is_file()
        key = "eval_stop_rate" if run == "sft_reflection" else "eval_option_accuracy"
        assert 0.0 <= metrics[key] <= 1.0, (run, metrics)
    for run in ("rl", "rl_plain"):
        history = json.loads((work / "outputs" / run / "log_history.json").read_text())
        assert any("env/success_rate" in h for h in history), run
        assert (work / "outputs" / run / "config.json").is_file()

    report = json.loads((work / "outputs/eval/results.json").read_text())
    assert {"settings", "configurations", "results"} <= set(report)
    assert report["settings"]["env_name"] == "lock_puzzle" and report["settings"]["split"] == "test"
    configurations = [c["name"] for c in report["configurations"]]
    assert len(configurations) == 6
    results = report["results"]
    # one decoding per configuration (greedy; the random policy samples) x 3 stages
    assert len(results) == 6 * 3
    fields = {"configuration", "stage", "decoding", "episodes", "successes", "success_rate", "ci_low"}
    for r in results:
        assert fields <= set(r), r
        assert r["episodes"] == 2 and 0.0 <= r["ci_low"] <= r["success_rate"] <= r["ci_high"] <= 1.0
        assert r["configuration"] in configurations and r["stage"] in ("one_dial", "two_dials", "three_dials")
    assert all(r["success_rate"] == 1.0 for r in results if r["configuration"] == "oracle")
    assert len(list((work / "outputs/eval/transcripts").glob("*.jsonl"))) == len(results)
    table = (work / "outputs/eval/results.md").read_text()
    assert "| Reflect-RL | greedy | three_dials |" in table
