"""Two real DDP processes (gloo, CPU) train the reflection player alone (``train_policy: false``): no forward runs
through the DDP wrapper, yet the reflection's gradients are averaged -- both ranks end with the same weights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}


def _run(cmd: list[str], timeout: float = 300) -> None:
    """``cmd`` in its own process group, killed whole on a timeout (ranks hung in a collective outlive the launcher)."""
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"timed out after {timeout} s (a rank waiting in a collective?): {cmd[-3:]}")
    assert proc.returncode == 0, stdout[-3000:] + stderr[-5000:]


def _launch(model_dir: str, out: Path, *extra: str) -> list[dict]:
    """`reflect-trl rl` in two gloo DDP processes (3 steps, as tests/trainers/test_rl_distributed.py); each rank's
    weights as saved by ddp_reflection_script.py."""
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ROOT / "recipes/accelerate_configs/cpu_ddp.yaml"),
        str(ROOT / "tests/trainers/ddp_reflection_script.py"),
        "--model_name_or_path", model_dir, "--reflection_model_name_or_path", model_dir,
        "--output_dir", str(out), "--env_name", "taxi", "--num_train_tasks", "8",
        "--per_device_train_batch_size", "4", "--num_generations", "2", "--max_steps", "3",
        "--learning_rate", "1e-3", "--reflection_max_new_tokens", "4", "--use_cpu", "true", "--bf16", "false",
        "--report_to", "none", "--save_strategy", "no", "--logging_steps", "1",
        "--train_reflection", "true", "--reflection_temperature", "1.0", "--reflection_learning_rate", "1e-2",
        "--advantage_estimator", "rloo",
        *extra,
    ]  # fmt: skip
    _run(cmd)
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["world_size"] == 2 and "MULTI_CPU" in r["distributed_type"] for r in records), records
    assert records[0]["steps"] == records[1]["steps"] == 3
    return [torch.load(out / f"weights_rank{r}.pt", weights_only=True) for r in range(2)]


def _max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys() and a
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


@pytest.mark.distributed
@pytest.mark.parametrize("train_policy", [False, True])
def test_two_process_ddp_averages_the_reflection_gradients(tiny_model_dir, tmp_path, train_policy):
    from reflect_trl.models import load_causal_lm

    ranks = _launch(tiny_model_dir, tmp_path / "ddp", "--train_policy", str(train_policy).lower())
    start = {k: v.detach() for k, v in load_causal_lm(tiny_model_dir).named_parameters()}
    reflection = [r["reflection"] for r in ranks]
    learnt = _max_difference(reflection[0], {k: start[k] for k in reflection[0]})
    assert learnt > 1e-4, "the reflection player did not learn"
    assert _max_difference(reflection[0], reflection[1]) < 1e-6, "the ranks' reflection players diverged"
    policy = [r["policy"] for r in ranks]
    assert _max_difference(policy[0], policy[1]) < 1e-6
    moved = _max_difference({k: v for k, v in policy[0].items() if k in start}, start)
    assert (moved > 1e-4) == train_policy


@pytest.mark.distributed
@pytest.mark.parametrize("train_policy", [False, True])
def test_two_process_reflection_gradient_equals_the_global_mean(tiny_model_dir, tmp_path, train_policy):
    """One micro-batch per rank, rank 1's padding rows only: the averaged reflection gradient on both ranks equals
    the gradient of the mean objective over the real turns of both ranks, computed by hand on one process."""
    out = tmp_path / "ddp_loss"
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ROOT / "recipes/accelerate_configs/cpu_ddp.yaml"),
        str(ROOT / "tests/trainers/ddp_reflection_loss_script.py"), tiny_model_dir, str(out), str(train_policy).lower(),
    ]  # fmt: skip
    _run(cmd)
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for record in records:
        assert record["world_size"] == 2
        assert record["window_turns"] == 5  # 5 real turns on rank 0, none on rank 1
        assert record["clipped"] > 0  # the clip is exercised
        assert record["max_grad_diff"] < 1e-5, record
        assert record["grad_norm"] > 0
