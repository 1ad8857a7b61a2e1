"""What a reflector sees, and the interface every reflector implements.

A reflector writes the reflection text of the data set: a short critique of the last action and a plan for
the next one. Reflectors return plain text; the data builder appends :data:`reflect_trl.prompts.STOP_MARKER`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from reflect_trl.envs.base import Observation, TextEnv

#: Backends of the frozen reflection player (:func:`reflect_trl.reflection.player.make_reflection_player`): ``hf``,
#: the model runs in this process; ``openai``, an OpenAI-compatible completions server runs it.
REFLECTION_BACKENDS = ("hf", "openai")


@dataclass
class ReflectionContext:
    """Everything a reflector may use about one decision point.

    ``env`` is the live environment *at the current state* (oracle reflectors may query it, e.g. its
    oracle). ``last_action`` is None on the first step. ``last_action_was_oracle`` says whether the last
    action was what the oracle would have done (False for an injected mistake).
    """

    env: TextEnv
    observation: Observation
    step: int
    oracle_action: int
    previous_observation: Observation | None = None
    last_action: str | None = None
    last_action_was_oracle: bool | None = None
    last_reward: float | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def oracle_action_text(self) -> str:
        return self.observation.actions[self.oracle_action]


class Reflector(Protocol):
    """Writes a reflection for a decision point (text without the stop marker)."""

    def reflect(self, ctx: ReflectionContext, rng: random.Random) -> str: ...
