"""Scripted players for :class:`~reflect_trl.rollout.RolloutEngine`: the environment's oracle, a uniform random
policy, the authors' Taxi behaviour policy "oracle + random 0.9" and a policy that always takes the move its
reflection names (evaluation's ``oracle`` / ``random`` / ``oracle_random`` / ``reflection_follower`` baselines), so
that every configuration plays through the same engine.

They read the live episodes the engine hands to ``act`` (:class:`~reflect_trl.rollout.LiveEpisode`), not token
ids: their ``tokenizer`` is None and the engine skips tokenizing the policy prompts for them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from reflect_trl.envs.base import OracleUnavailableError
from reflect_trl.prompts import DEFAULT_LABELS, recommended_action
from reflect_trl.seeding import derive_seed

if TYPE_CHECKING:  # the engine imports torch; the pipelines read SCRIPTED_ACTORS without it
    from reflect_trl.rollout import LiveEpisode

ActResult = tuple[list[int], list[float], list[float], None]


class ScriptedActor:
    """Base of the actors that choose from the live environments instead of a model."""

    name = "scripted"
    tokenizer = None
    needs_reflection = False  # True: it chooses from the turn's reflection, so a configuration must give one
    #: its one decoding in an evaluation ("greedy": deterministic, "sampled": it draws); None: the evaluation's
    decoding: str | None = None

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
    decoding = "greedy"

    def choose(self, live: Sequence[LiveEpisode]) -> ActResult:
        return [_oracle_option(view) for view in live], [0.0] * len(live), [0.0] * len(live), None


def _oracle_option(view: LiveEpisode) -> int:
    """The option that shows the oracle's action (the first option where the settings pruned it)."""
    try:
        return view.prompt.option_of(view.env.oracle_action())
    except OracleUnavailableError:
        return 0


class RandomActor(ScriptedActor):
    """Picks one of the offered options uniformly; the draw of turn ``t`` of an episode depends only on the episode
    seed and ``t`` (``derive_seed(seed, "random_policy", t)``), not on the batch it runs in."""

    name = "random"
    decoding = "sampled"

    def choose(self, live: Sequence[LiveEpisode]) -> ActResult:
        draws = [_uniform_option(view, "random_policy") for view in live]
        return [d[0] for d in draws], [d[1] for d in draws], [d[2] for d in draws], None


def _uniform_option(view: LiveEpisode, stream: str) -> tuple[int, float, float]:
    """A uniformly drawn option, its log-prob and the entropy: the draw depends only on the episode seed, ``stream``
    and the turn (``derive_seed(seed, stream, t)``), not on the batch."""
    n = view.prompt.num_options
    rng = random.Random(derive_seed(view.episode.seed, stream, view.episode.length))
    return rng.randrange(n), -math.log(n), math.log(n)


class OracleRandomActor(ScriptedActor):
    """The behaviour policy of the authors' DangerousTaxi SFT data ("oracle + random p", p = 0.9 in the ``paper``
    protocol; ``oracle_random:0.5`` plays p = 0.5): with probability p a uniformly drawn option, else the oracle's. A
    policy that fits the policy targets of such data (the executed actions) perfectly plays this, given a reflection
    that names the oracle's move, so its success bounds that SFT start's sampled success. Draws depend only on the
    episode seed and the turn."""

    name = "oracle_random"
    decoding = "sampled"
    default_random_action_prob = 0.9  # the authors'

    def __init__(
        self, labels: Sequence[str] = DEFAULT_LABELS, random_action_prob: float | None = None
    ) -> None:
        super().__init__(labels)
        p = self.default_random_action_prob if random_action_prob is None else float(random_action_prob)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"oracle_random: the random action probability must be in [0, 1], got {p}")
        self.random_action_prob = p

    def choose(self, live: Sequence[LiveEpisode]) -> ActResult:
        options, logps, entropies = [], [], []
        p = self.random_action_prob
        for view in live:
            n = view.prompt.num_options
            oracle = _oracle_option(view)
            rng = random.Random(derive_seed(view.episode.seed, "oracle_random_policy", view.episode.length))
            option = rng.randrange(n) if rng.random() < p else oracle
            probs = [p / n + (1.0 - p) * (i == oracle) for i in range(n)]
            options.append(option)
            logps.append(math.log(probs[option]))
            entropies.append(-sum(q * math.log(q) for q in probs if q > 0))
        return options, logps, entropies, None


class ReflectionFollowerActor(ScriptedActor):
    """Takes the move its reflection names (``prompts.recommended_action``, the rule of the reflection diagnostics);
    a uniformly drawn option where the reflection names none (draws from the episode seed and the turn). What a
    policy that has learnt only to copy its reflection reaches: the ceiling of RL that sharpens copying, the mechanism
    the diagnostics find (docs/experiments.md §1.4h). Needs a reflection player."""

    name = "reflection_follower"
    needs_reflection = True

    def choose(self, live: Sequence[LiveEpisode]) -> ActResult:
        draws = []
        for view in live:
            if view.reflection is None:
                raise ValueError(
                    "the reflection_follower policy needs a reflection player (a configuration's reflection)"
                )
            actions = view.env.observation.actions if view.env.observation is not None else ()
            named = recommended_action(view.reflection, actions)
            if named is not None and named in view.prompt.order:
                draws.append((view.prompt.option_of(named), 0.0, 0.0))
            else:
                draws.append(_uniform_option(view, "reflection_follower_policy"))
        return [d[0] for d in draws], [d[1] for d in draws], [d[2] for d in draws], None


SCRIPTED_ACTORS: dict[str, type[ScriptedActor]] = {
    "oracle": OracleActor,
    "random": RandomActor,
    "oracle_random": OracleRandomActor,
    "reflection_follower": ReflectionFollowerActor,
}


#: ``<actor>:<value>`` gives the actor this keyword (``oracle_random:0.5``); actors not named here take none.
SCRIPTED_PARAMETERS: dict[str, str] = {"oracle_random": "random_action_prob"}


def scripted_class(name: str) -> type[ScriptedActor] | None:
    """The actor class a policy name plays (``oracle``, ``oracle_random:0.5``, ...), None for a model path / hub id."""
    base, sep, _ = name.partition(":")
    if base not in SCRIPTED_ACTORS or (sep and base not in SCRIPTED_PARAMETERS):
        return None
    return SCRIPTED_ACTORS[base]


def is_scripted_policy(name: str) -> bool:
    """Whether ``name`` names a scripted policy rather than a model."""
    return scripted_class(name) is not None


def scripted_actor(name: str, labels: Sequence[str] = DEFAULT_LABELS) -> ScriptedActor:
    """The scripted actor called ``name`` (:data:`SCRIPTED_ACTORS`; ``oracle_random:<p>`` with its probability)."""
    cls = scripted_class(name)
    if cls is None:
        known = (*SCRIPTED_ACTORS, *(f"{k}:<{v}>" for k, v in SCRIPTED_PARAMETERS.items()))
        raise ValueError(f"unknown scripted policy {name!r}; known: {known}")
    base, sep, value = name.partition(":")
    if not sep:
        return cls(labels)
    try:
        number = float(value)
    except ValueError:
        raise ValueError(
            f"scripted policy {name!r}: {SCRIPTED_PARAMETERS[base]} {value!r} is not a number"
        ) from None
    return cls(labels, **{SCRIPTED_PARAMETERS[base]: number})


__all__ = [
    "SCRIPTED_ACTORS",
    "SCRIPTED_PARAMETERS",
    "OracleActor",
    "OracleRandomActor",
    "RandomActor",
    "ReflectionFollowerActor",
    "ScriptedActor",
    "is_scripted_policy",
    "scripted_actor",
    "scripted_class",
]
