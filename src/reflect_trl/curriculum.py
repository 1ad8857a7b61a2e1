"""Curriculum over task difficulty, shared by all environments.

Stages come from the environment's difficulty tags (DangerousTaxi: pickup -> dropoff -> full; AutoExplore:
depth1 -> depth2 -> depth3). Promotion to the next stage happens either

* ``schedule="steps"``: at fixed optimizer steps (the paper: stage k starts at k * max_steps / n_stages), or
* ``schedule="success"``: when the success rate over the last ``window`` training episodes of the current
  stage reaches ``threshold`` (checked only once the window is full).

Stages are sequential, as in the paper: each stage trains on its own tasks only (the RL trainer's
``curriculum_mix_share`` draws a share of a rollout's tasks from the other stages). The curriculum state is
plain data (``state_dict``) so trainers can checkpoint and restore it.
"""

from __future__ import annotations

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


# ------------------------------------------------------------------------------ task sampling within a stage
TASK_SAMPLINGS = ("uniform", "failures")


@dataclass
class FailurePriorities:
    """Failure-prioritised task sampling within a stage (in the spirit of Prioritized Level Replay, Jiang et al.
    2021, with the recent failure rate as the score).

    Each problem instance (``TextEnv.instance_key``) keeps a score ``s``: the failure rate of its episodes in the
    last rollout that drew it, smoothed over rollouts, ``s <- (1 - alpha) s + alpha (1 - success rate)``; an instance
    never drawn scores 1 (optimistic, so every instance gets looked at). A task of a pool of N is drawn with

        P(task i) = rho / N + (1 - rho) * s_i / sum_j s_j          (uniform when every score is 0)

    ``rho`` (``uniform_share``) keeps every task in play, so the instances the policy already solves are still
    rehearsed while the batch leans towards those it fails. The scores are plain data (``state_dict``)."""

    uniform_share: float = 0.5
    alpha: float = 0.5
    scores: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 <= self.uniform_share <= 1.0:
            raise ValueError(f"task sampling: uniform_share must be in [0, 1], got {self.uniform_share}")
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"task sampling: alpha must be in (0, 1], got {self.alpha}")

    def score(self, key: str) -> float:
        return self.scores.get(key, 1.0)

    def weights(self, keys: Sequence[str]) -> list[float]:
        """P(task i) for a pool whose tasks have the instance keys ``keys`` (sums to 1)."""
        n = len(keys)
        if n == 0:
            return []
        scores = [self.score(k) for k in keys]
        total = sum(scores)
        if total <= 0.0:
            return [1.0 / n] * n
        return [self.uniform_share / n + (1.0 - self.uniform_share) * s / total for s in scores]

    def update(self, outcomes: Sequence[tuple[str, bool]]) -> None:
        """Record one rollout's episode outcomes as (instance key, success) pairs, from every process."""
        by_key: dict[str, list[bool]] = {}
        for key, success in outcomes:
            by_key.setdefault(key, []).append(bool(success))
        for key, results in by_key.items():
            failure = 1.0 - sum(results) / len(results)
            old = self.scores.get(key)
            self.scores[key] = failure if old is None else (1.0 - self.alpha) * old + self.alpha * failure

    def state_dict(self) -> dict[str, Any]:
        return {"scores": dict(self.scores)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scores = {str(k): float(v) for k, v in state.get("scores", {}).items()}
