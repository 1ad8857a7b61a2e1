"""Scripted players for :class:`~reflect_trl.rollout.RolloutEngine`: the environment's oracle and a uniform random
policy (evaluation's ``oracle`` / ``random`` baselines), so that every configuration plays through the same engine.

They read the live episodes the engine hands to ``act`` (:class:`~reflect_trl.rollout.LiveEpisode`), not token
ids: their ``tokenizer`` is None and the engine skips tokenizing the policy prompts for them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from reflect_trl.envs.base import OracleUnavailableError
from reflect_trl.prompts import DEFAULT_LABELS
from reflect_trl.rollout import LiveEpisode
from reflect_trl.seeding import derive_seed

ActResult = tuple[list[int], list[float], list[float], None]


class ScriptedActor:
    """Base of the actors that choose from the live environments instead of a model."""

    name = "scripted"
    tokenizer = None

    def __init__(self, labels: Sequence[str] = DEFAULT_LABELS) -> None:
        self._labels = tuple(labels)

    @property
    def labels(self) -> tuple[str, ...]:
        return self._labels

    def act(
        self,
        prompt_ids: Sequence[Sequence[int]],
        num_options: Sequence[int],
        live: Sequence[LiveEpisode] | None = None,
    ) -> ActResult:
        if live is None:
            raise ValueError(
                f"the {self.name} actor chooses from the live episodes; the engine must pass `live`"
            )
        return self.choose(live)

    def choose(self, live: Sequence[LiveEpisode]) -> ActResult:
        raise NotImplementedError


class OracleActor(ScriptedActor):
    """Takes the environment's oracle action (``env.oracle_action()``) at the option where the prompt shows it. Where
    the environment's option settings pruned the oracle's action (:class:`OracleUnavailableError`) it takes the first
    option: the task is not solvable as configured, and its episode counts as such."""

    name = "oracle"

    def choose(self, live: Sequence[LiveEpisode]) -> ActResult:
        options = []
        for view in live:
            try:
                options.append(view.prompt.option_of(view.env.oracle_action()))
            except OracleUnavailableError:
                options.append(0)
        return options, [0.0] * len(live), [0.0] * len(live), None


class RandomActor(ScriptedActor):
    """Picks one of the offered options uniformly; the draw of turn ``t`` of an episode depends only on the episode
    seed and ``t`` (``derive_seed(seed, "random_policy", t)``), not on the batch it runs in."""

    name = "random"

    def choose(self, live: Sequence[LiveEpisode]) -> ActResult:
        options, logps, entropies = [], [], []
        for view in live:
            n = view.prompt.num_options
            rng = random.Random(derive_seed(view.episode.seed, "random_policy", view.episode.length))
            options.append(rng.randrange(n))
            logps.append(-math.log(n))
            entropies.append(math.log(n))
        return options, logps, entropies, None


SCRIPTED_ACTORS: dict[str, type[ScriptedActor]] = {"oracle": OracleActor, "random": RandomActor}


def scripted_actor(name: str, labels: Sequence[str] = DEFAULT_LABELS) -> ScriptedActor:
    """The scripted actor called ``name`` (``oracle`` or ``random``)."""
    if name not in SCRIPTED_ACTORS:
        raise ValueError(f"unknown scripted policy {name!r}; known: {tuple(SCRIPTED_ACTORS)}")
    return SCRIPTED_ACTORS[name](labels)


__all__ = ["SCRIPTED_ACTORS", "OracleActor", "RandomActor", "ScriptedActor", "scripted_actor"]
