"""Two real DDP processes (gloo, CPU) run a few RL steps and stay in sync."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.distributed
@pytest.mark.parametrize("estimator", ["gae", "gigpo"])
def test_two_process_ddp_ranks_stay_in_sync(tiny_model_dir, tmp_path, estimator):
    out = tmp_path / "ddp"
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ROOT / "recipes/accelerate_configs/cpu_ddp.yaml"),
        str(ROOT / "tests/trainers/ddp_rl_script.py"),
        "--model_name_or_path",
        tiny_model_dir,
        "--reflection_model_name_or_path",
        tiny_model_dir,
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
        "--advantage_estimator",
        estimator,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["world_size"] == 2 and "MULTI_CPU" in r["distributed_type"] for r in records), records
    assert records[0]["checksum"] == records[1]["checksum"]
    assert records[0]["stage"] == records[1]["stage"]
    assert records[0]["steps"] == records[1]["steps"] == 3
    assert all(r["process_group_torn_down"] for r in records)
    expected = {"gae": "explained_variance", "gigpo": "gigpo/grouped_turn_share"}[estimator]
    assert expected in records[0]["logged_keys"], records[0]["logged_keys"]
