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
from dataclasses import asdict, dataclass
from typing import Any


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
        if not self.turns or k <= 0:
            return []
        return [self.turns[self.rng.randrange(len(self.turns))] for _ in range(k)]

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
        rng_state = state["rng"]
        self.rng.setstate((rng_state[0], tuple(rng_state[1]), rng_state[2]))
