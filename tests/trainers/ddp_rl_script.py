"""Run `reflect-trl rl` under `accelerate launch` and record, per rank, a checksum of the trained weights.

``ZERO_ADVANTAGE_RANKS`` (e.g. "0" or "0,1"): those ranks' rollout turns get a zero advantage (``skip_no_signal_steps``
must then decide alike on every rank)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from reflect_trl.cli.rl import run_rl
from reflect_trl.trainers import rl_batch
from reflect_trl.trainers.rl_trainer import ReflectPPOTrainer


def _zero_advantages_on(ranks: set[int]) -> None:
    episode_rows = ReflectPPOTrainer._episode_rows

    def rows(self, episodes):
        out = episode_rows(self, episodes)
        if self.accelerator.process_index in ranks:
            out = rl_batch.with_advantages(out, [0.0] * len(out))
        return out

    ReflectPPOTrainer._episode_rows = rows


if __name__ == "__main__":
    if os.environ.get("ZERO_ADVANTAGE_RANKS"):
        _zero_advantages_on({int(r) for r in os.environ["ZERO_ADVANTAGE_RANKS"].split(",")})
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
        "skipped_steps": trainer._skip_guard.skipped_steps if trainer._skip_guard is not None else None,
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
