"""Curriculum over task difficulty, shared by all environments.

Stages come from the environment's difficulty tags (DangerousTaxi: pickup -> dropoff -> full; AutoExplore:
depth1 -> depth2 -> depth3). Promotion to the next stage happens either

* ``schedule="steps"``: at fixed optimizer steps (the paper: stage k starts at k * max_steps / n_stages), or
* ``schedule="success"``: when the success rate over the last ``window`` training episodes of the current
  stage reaches ``threshold`` (checked only once the window is full).

Stages are sequential, as in the paper: each stage trains on its own tasks only. :class:`TaskSampler` draws a
rollout's tasks uniformly from the current stage's pool with a seeded RNG. Both states are plain data
(``state_dict``) so trainers can checkpoint and restore them.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

SCHEDULES = ("steps", "success")


@dataclass
class Curriculum:
    stages: Sequence[str]
    schedule: str = "steps"
    max_steps: int = 0
    stage_starts: Sequence[int] | None = None  # optimizer step at which each stage starts ("steps")
    threshold: float = 0.8  # success rate that promotes ("success")
    window: int = 64  # episodes in the success window ("success")
    stage_index: int = 0
    _recent: deque = field(default_factory=deque, repr=False)

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a curriculum needs at least one stage")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown curriculum schedule {self.schedule!r}; choose one of {SCHEDULES}")
        if self.schedule == "steps":
            if self.stage_starts is None:
                n = len(self.stages)
                self.stage_starts = [k * self.max_steps // n for k in range(n)]
            if len(self.stage_starts) != len(self.stages) or list(self.stage_starts) != sorted(
                self.stage_starts
            ):
                raise ValueError(
                    f"curriculum stage_starts {list(self.stage_starts)} must be sorted, one per stage {list(self.stages)}"
                )
        self._recent = deque(self._recent, maxlen=self.window)

    @property
    def stage(self) -> str:
        return self.stages[self.stage_index]

    @property
    def is_last(self) -> bool:
        return self.stage_index == len(self.stages) - 1

    def update(self, global_step: int, successes: Sequence[bool] = ()) -> bool:
        """Record this rollout's episode outcomes and promote if due. Returns True on promotion."""
        if self.schedule == "steps":
            # Stage 0 is active until the next start, even if its own start is after step 0.
            target = max((k for k, start in enumerate(self.stage_starts) if start <= global_step), default=0)
            promoted = target > self.stage_index
            self.stage_index = max(self.stage_index, target)
            if promoted:
                self._recent.clear()
            return promoted
        self._recent.extend(bool(s) for s in successes)
        if not self.is_last and len(self._recent) == self.window and self.success_rate >= self.threshold:
            self.stage_index += 1
            self._recent.clear()
            return True
        return False

    @property
    def success_rate(self) -> float:
        return sum(self._recent) / len(self._recent) if self._recent else 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"stage_index": self.stage_index, "recent": list(self._recent), "stages": list(self.stages)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if list(state.get("stages", self.stages)) != list(self.stages):
            raise ValueError(
                f"checkpoint curriculum stages {state.get('stages')} differ from {list(self.stages)}"
            )
        self.stage_index = int(state["stage_index"])
        self._recent = deque((bool(x) for x in state.get("recent", [])), maxlen=self.window)


class TaskSampler:
    """The training tasks of an RL run by curriculum stage, and the draw of a rollout's tasks: uniform over the
    current stage's pool (every stage's pool at once without a curriculum), from a seeded, checkpointed RNG."""

    def __init__(self, pools: dict[str, list[Any]], curriculum: Curriculum, seed: int) -> None:
        self.pools = pools
        self.curriculum = curriculum
        self.rng = random.Random(seed)

    def draw(self, n_tasks: int) -> list[Any]:
        """``n_tasks`` tasks of the current stage (with replacement)."""
        pool = self.pools[self.curriculum.stage]
        return [pool[self.rng.randrange(len(pool))] for _ in range(n_tasks)]

    def state_dict(self) -> dict[str, Any]:
        return {"curriculum": self.curriculum.state_dict(), "task_rng": self.rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.curriculum.load_state_dict(state["curriculum"])
        rng = state["task_rng"]
        self.rng.setstate((rng[0], tuple(rng[1]), rng[2]))
