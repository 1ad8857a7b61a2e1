"""Run `reflect-trl rl` under `accelerate launch` and record, per rank, a checksum of the trained weights."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from reflect_trl.cli.rl import run_rl

if __name__ == "__main__":
    trainer = run_rl(sys.argv[1:])
    model = trainer.accelerator.unwrap_model(trainer.model)
    rank = trainer.accelerator.process_index
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    record = {
        "rank": rank,
        "world_size": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "checksum": checksum,
        "stage": trainer.curriculum.stage,
        "steps": trainer.state.global_step,
        "process_group_torn_down": not torch.distributed.is_initialized(),  # run_rl tears it down
        "logged_keys": sorted(set().union(*(h.keys() for h in trainer.state.log_history))),
        "evaluations": [h for h in trainer.state.log_history if "eval_success_rate" in h],
        "reflection_checksum": float(
            sum(p.detach().double().sum() for p in trainer.reflection_learner.model.parameters())
        )
        if trainer.reflection_learner is not None
        else None,
    }
    (Path(trainer.args.output_dir) / f"rank{rank}.json").write_text(json.dumps(record) + "\n")
