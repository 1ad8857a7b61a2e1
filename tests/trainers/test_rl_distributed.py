"""Two real DDP processes (gloo, CPU) run a few RL steps and stay in sync."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _launch(model_dir: str, out: Path, *extra: str, env: dict[str, str] | None = None) -> list[dict]:
    """`reflect-trl rl` in two gloo DDP processes (3 steps); each rank's record of ddp_rl_script.py."""
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ROOT / "recipes/accelerate_configs/cpu_ddp.yaml"),
        str(ROOT / "tests/trainers/ddp_rl_script.py"),
        "--model_name_or_path",
        model_dir,
        "--reflection_model_name_or_path",
        model_dir,
        "--output_dir",
        str(out),
        "--env_name",
        "taxi",
        "--num_train_tasks",
        "8",
        "--per_device_train_batch_size",
        "4",
        "--num_generations",
        "2",
        "--max_steps",
        "3",
        "--learning_rate",
        "1e-3",
        "--reflection_max_new_tokens",
        "4",
        "--use_cpu",
        "true",
        "--bf16",
        "false",
        "--report_to",
        "none",
        "--save_strategy",
        "no",
        "--logging_steps",
        "1",
        *extra,
    ]
    env = {
        **os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false", **(env or {})
    }  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.distributed
@pytest.mark.parametrize("estimator", ["gae", "gigpo"])
def test_two_process_ddp_ranks_stay_in_sync(tiny_model_dir, tmp_path, estimator):
    records = _launch(tiny_model_dir, tmp_path / "ddp", "--advantage_estimator", estimator)
    assert all(r["world_size"] == 2 and "MULTI_CPU" in r["distributed_type"] for r in records), records
    assert records[0]["checksum"] == records[1]["checksum"]
    assert records[0]["stage"] == records[1]["stage"]
    assert records[0]["steps"] == records[1]["steps"] == 3
    assert all(r["process_group_torn_down"] for r in records)
    expected = {"gae": "explained_variance", "gigpo": "gigpo/grouped_turn_share"}[estimator]
    assert expected in records[0]["logged_keys"], records[0]["logged_keys"]


@pytest.mark.distributed
@pytest.mark.parametrize(("zero_ranks", "skipped"), [("0,1", 3), ("0", 0)])
def test_two_process_ddp_skips_no_signal_steps_together(tiny_model_dir, tmp_path, zero_ranks, skipped):
    """skip_no_signal_steps under DDP: the decision counts the turns with advantage on all ranks, so both ranks skip
    every step when neither has one, and neither skips when only one lacks them; the weights stay in sync."""
    from reflect_trl.models import load_causal_lm

    records = _launch(
        tiny_model_dir, tmp_path / "ddp", "--skip_no_signal_steps", "true", "--advantage_estimator", "rloo",
        env={"ZERO_ADVANTAGE_RANKS": zero_ranks},
    )  # fmt: skip
    assert records[0]["skipped_steps"] == records[1]["skipped_steps"] == skipped
    assert records[0]["checksum"] == records[1]["checksum"]
    assert records[0]["steps"] == records[1]["steps"] == 3
    start = float(sum(p.detach().double().sum() for p in load_causal_lm(tiny_model_dir).parameters()))
    assert (records[0]["checksum"] == start) == (skipped == 3)


@pytest.mark.distributed
def test_two_process_ddp_trains_both_players_in_sync(tiny_model_dir, tmp_path):
    """train_reflection under DDP: the reflection player rides in the DDP-wrapped policy, so its gradients are
    averaged too -- both ranks end with the same reflection weights, which moved."""
    from reflect_trl.models import load_causal_lm

    records = _launch(
        tiny_model_dir, tmp_path / "ddp", "--train_reflection", "true", "--reflection_temperature", "1.0",
        "--reflection_learning_rate", "1e-2", "--advantage_estimator", "rloo",
    )  # fmt: skip
    start = float(sum(p.detach().double().sum() for p in load_causal_lm(tiny_model_dir).parameters()))
    assert records[0]["reflection_checksum"] == records[1]["reflection_checksum"] != start
    assert records[0]["checksum"] == records[1]["checksum"]
    assert "reflection/policy_loss" in records[0]["logged_keys"]
    assert (tmp_path / "ddp" / "reflection" / "config.json").is_file()


@pytest.mark.distributed
def test_two_processes_share_the_evaluation_episodes(tiny_model_dir, tmp_path):
    """Each rank plays half of the evaluation episodes; the gathered rates are those of one process playing all."""
    from reflect_trl.evaluation import EvalConfiguration, EvalSettings, evaluate

    records = _launch(
        tiny_model_dir,
        tmp_path / "ddp",
        *("--eval_strategy", "steps", "--eval_steps", "3", "--eval_on_start", "true"),
        *("--eval_episodes_per_stage", "5", "--reflection_temperature", "1.0"),
    )

    def without_runtime(evaluations: list[dict]) -> list[dict]:
        return [{k: v for k, v in h.items() if k != "eval_runtime"} for h in evaluations]

    assert without_runtime(records[0]["evaluations"]) == without_runtime(records[1]["evaluations"])
    start, end = records[0]["evaluations"]
    assert (start["step"], end["step"]) == (0, 3)
    # one process evaluating the same policy alone (the initial model at step 0, the saved one at step 3) plays the
    # same episodes
    settings = EvalSettings(
        split="validation", seed=777, episodes_per_stage=5, decodings=["greedy"], reflection_max_new_tokens=4
    )
    for logged, policy in ((start, tiny_model_dir), (end, str(tmp_path / "ddp"))):
        report = evaluate([EvalConfiguration("p", policy, tiny_model_dir)], settings, progress=False)
        for result in report.results:
            assert logged[f"eval_{result.stage}_success_rate"] == pytest.approx(result.success_rate)
        lengths = sum(r.mean_length for r in report.results) / len(report.results)
        assert logged["eval_episode_length"] == pytest.approx(lengths), policy
