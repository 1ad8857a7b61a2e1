"""Run `reflect-trl rl` under `accelerate launch`; each rank saves its reflection player's and its policy's weights."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from reflect_trl.cli.rl import run_rl

if __name__ == "__main__":
    trainer = run_rl(sys.argv[1:])
    rank = trainer.accelerator.process_index
    out = Path(trainer.args.output_dir)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    with trainer.reflection_learner.detached(policy):
        policy_state = {k: v.detach().cpu() for k, v in policy.state_dict().items()}
    torch.save(
        {"reflection": trainer.reflection_learner.trainable_state(), "policy": policy_state},
        out / f"weights_rank{rank}.pt",
    )
    record = {
        "rank": rank,
        "world_size": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "steps": trainer.state.global_step,
        "logged_keys": sorted(set().union(*(h.keys() for h in trainer.state.log_history))),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(record) + "\n")
