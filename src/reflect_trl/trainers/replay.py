"""Replay buffer of successful episodes' turns (the paper's self-imitation buffer).

Turns of successful episodes are stored (FIFO, bounded); each rollout can add ``k`` of them, sampled with a
seeded generator, to the training batch, where they enter the clipped surrogate with advantage
``replay_weight`` (a positive constant: "do this again"), like the paper's second trainer call on replayed
successes. No importance correction is applied, as in the paper; the old log-probs are recomputed with the
current policy so the PPO ratio starts at 1.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

T = TypeVar("T")


def draw_with_replacement(rng: random.Random, items: Sequence[T], k: int) -> list[T]:
    """``k`` seeded draws from ``items`` with replacement (empty when there is nothing to draw)."""
    if not items or k <= 0:
        return []
    return [items[rng.randrange(len(items))] for _ in range(k)]


def restore_rng(rng: random.Random, state: Any) -> None:
    """``rng.setstate`` from a state that went through JSON/torch serialisation (the inner tuple became a list)."""
    rng.setstate((state[0], tuple(state[1]), state[2]))


@dataclass(frozen=True)
class ReplayTurn:
    prompt_ids: tuple[int, ...]
    option: int  # position of the chosen option in the prompt
    num_options: int
    return_to_go: float


class ReplayBuffer:
    def __init__(self, capacity: int = 512, seed: int = 0) -> None:
        self.capacity = capacity
        self.turns: deque[ReplayTurn] = deque(maxlen=capacity)
        self.rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self.turns)

    def add(self, turns: list[ReplayTurn]) -> None:
        self.turns.extend(turns)

    def clear(self) -> None:
        self.turns.clear()

    def sample(self, k: int) -> list[ReplayTurn]:
        return draw_with_replacement(self.rng, self.turns, k)

    def state_dict(self) -> dict[str, Any]:
        return {
            "turns": [asdict(t) for t in self.turns],
            "rng": self.rng.getstate(),
            "capacity": self.capacity,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.turns = deque(
            (
                ReplayTurn(tuple(t["prompt_ids"]), t["option"], t["num_options"], t["return_to_go"])
                for t in state["turns"]
            ),
            maxlen=self.capacity,
        )
        restore_rng(self.rng, state["rng"])
