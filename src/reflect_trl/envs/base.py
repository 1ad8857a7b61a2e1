"""The text-environment interface every reflect-trl environment implements.

An environment is a multi-turn text game. ``reset`` starts an episode for a :class:`Task` and returns an
:class:`Observation` (state text + the list of legal action strings); ``step`` takes the *index* of one of
those actions. ``info["success"]`` is always set explicitly on the final step of an episode.

Each environment also exposes:

* ``stages``: its difficulty levels from easy to hard, used by the curriculum (a task's ``difficulty``
  is one of them);
* ``make_tasks``: deterministic, seeded task generation with disjoint ``train`` / ``validation`` / ``test``
  splits;
* ``oracle_action``: the index of an optimal action in the current state (data generation, oracle
  reflections, evaluation of the oracle policy);
* ``state_key``: a hashable key of the current *Markov* state (what decides future observations and rewards,
  nothing of the history), used to group the turns of several episodes that stand in the same state
  (``advantage_estimator="gigpo"``).
"""

from __future__ import annotations

import copy
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class Observation:
    """What the agent sees: the state text and the legal actions (in the environment's canonical order)."""

    text: str
    actions: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "actions", tuple(self.actions))
        if not self.actions:
            raise ValueError("an Observation needs at least one legal action")


@dataclass(frozen=True)
class Task:
    """One problem instance of an environment.

    ``seed`` fixes everything random about the instance (e.g. the Taxi start state); ``data`` holds
    environment-specific fields (e.g. an AutoExplore question and its target files).
    """

    env: str
    task_id: str
    difficulty: str
    seed: int
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "env": self.env,
            "task_id": self.task_id,
            "difficulty": self.difficulty,
            "seed": self.seed,
            "data": dict(self.data),
        }

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> Task:
        missing = [k for k in ("env", "task_id", "difficulty", "seed") if k not in record]
        if missing:
            raise KeyError(f"task record lacks field(s) {missing}: {dict(record)!r}")
        return cls(
            env=str(record["env"]),
            task_id=str(record["task_id"]),
            difficulty=str(record["difficulty"]),
            seed=int(record["seed"]),
            data=dict(record.get("data") or {}),
        )


# (observation, reward, terminated, truncated, info) — the gymnasium step convention.
StepResult = tuple[Observation, float, bool, bool, dict[str, Any]]


def split_seed(base_seed: int, split: str, index: int) -> int:
    """A 31-bit seed for task ``index`` of ``split``: stable across runs/platforms, disjoint across splits
    with overwhelming probability (a hash, not Python's salted ``hash``)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    digest = hashlib.sha256(f"{base_seed}/{split}/{index}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


class OracleUnavailableError(RuntimeError):
    """The oracle's next action is not among the offered options (e.g. pruned by an environment's option settings):
    the task cannot be solved as configured. Data generation skips such a task and counts it."""


class TextEnv(ABC):
    """Base class of all environments. Subclasses set ``name``/``stages`` and implement the abstract methods."""

    name: ClassVar[str] = ""
    stages: ClassVar[tuple[str, ...]] = ()
    #: constructor kwargs that only shape training episodes (augmentation, reward shaping that hints at the goal);
    #: evaluation environments are built without them (``ReflectPPOConfig.evaluation_env_kwargs``)
    training_only_kwargs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, horizon: int = 15) -> None:
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        self.horizon = horizon
        self.task: Task | None = None
        self.observation: Observation | None = None
        self.t = 0  # steps taken in the current episode
        self.done = True

    # -- tasks -------------------------------------------------------------------------------------------
    @abstractmethod
    def make_tasks(self, split: str, n: int, seed: int = 0, difficulty: str | None = None) -> list[Task]:
        """``n`` tasks of ``split`` (``difficulty`` None = spread over all stages). Same arguments → same tasks."""

    def check_difficulty(self, difficulty: str) -> str:
        if difficulty not in self.stages:
            raise ValueError(
                f"{self.name}: unknown difficulty {difficulty!r}; known stages: {list(self.stages)}"
            )
        return difficulty

    # -- episode -----------------------------------------------------------------------------------------
    @abstractmethod
    def reset(self, seed: int | None = None, task: Task | None = None) -> Observation:
        """Start an episode.

        ``task`` fixes the problem instance: everything random about the instance (e.g. the Taxi start state)
        comes from ``task.seed``, so several episodes of one task start from the same state. ``seed`` seeds only
        episode-level randomness (e.g. AutoExplore's leave-out augmentation). With ``task`` None, a task is
        drawn from ``seed``."""

    @abstractmethod
    def step(self, action_index: int) -> StepResult:
        """Take the legal action ``self.observation.actions[action_index]``."""

    @abstractmethod
    def oracle_action(self) -> int:
        """Index (into the current legal actions) of an optimal action."""

    def optimal_actions(self) -> frozenset[int]:
        """Every optimal action of the current state (ties included), for the evaluation's reflection diagnostics;
        default: the oracle's. An environment whose oracle picks one of several equally good actions overrides it."""
        return frozenset({self.oracle_action()})

    def instance_key(self, task: Task) -> str:
        """A key of the problem instance ``task`` poses: two tasks with equal keys are the same problem (Taxi: the
        same stage and start state, whatever their seeds). Held-out statistics resample instances, not episodes, so
        duplicated instances do not narrow the intervals. Default: every task is its own instance."""
        return task.task_id

    def state_key(self) -> Hashable:
        """A hashable key of the current Markov state, taken *before* the next action.

        Two episodes of one task whose keys are equal must face the same future: the same legal actions, the same
        observations and rewards for every action sequence from here, up to the remaining horizon (the step
        counter is deliberately left out, so that visits of one state at different turns share a group). The key
        must not contain the history (an observation that lists the actions taken so far would never match).
        Used by the state-grouped advantages of ``advantage_estimator="gigpo"``; environments that do not
        implement it can use every other estimator."""
        raise NotImplementedError(
            f"{type(self).__name__} ({self.name!r}) does not implement state_key(); it is needed by "
            "advantage_estimator='gigpo' (see reflect_trl.envs.base.TextEnv.state_key)"
        )

    def clone(self) -> TextEnv:
        """An independent copy at the same state (used to test a candidate action without taking it).

        Environments whose state cannot be deep-copied (external game engines) override this, e.g. by
        replaying the episode's actions in a fresh instance."""
        return copy.deepcopy(self)

    def _check_action(self, action_index: int) -> int:
        if self.done or self.observation is None:
            raise RuntimeError(f"{self.name}: step() called on a finished episode; call reset() first")
        n = len(self.observation.actions)
        if not 0 <= int(action_index) < n:
            raise IndexError(f"{self.name}: action index {action_index} out of range (0..{n - 1})")
        return int(action_index)


#: the setting (``reflect-trl eval``) or ``eval_env_kwargs`` key (``reflect-trl rl``) that lets an evaluation use the
#: training-only kwargs it names
ALLOW_TRAINING_ONLY_KWARGS = "allow_training_only_kwargs"


def check_evaluation_kwargs(
    env_class: type[TextEnv],
    kwargs: Mapping[str, Any] | None,
    allowed: Sequence[str] | None = None,
    setting: str = "env_kwargs",
    how_to_allow: str | None = None,
) -> None:
    """Refuse, in the kwargs of an *evaluation* environment, the environment's ``training_only_kwargs`` (they shape
    training episodes and can give the answer away, e.g. AutoExplore's ``leaveout_prob``) unless ``allowed`` names
    them. ``setting`` names where the kwargs come from and ``how_to_allow`` how a run allows one (``{name}`` is
    replaced by the kwarg); raises ``ValueError`` with a one-line message."""
    training_only = tuple(env_class.training_only_kwargs)
    allowed = tuple(allowed or ())
    unknown = [name for name in allowed if name not in training_only]
    if unknown:
        raise ValueError(
            f"{ALLOW_TRAINING_ONLY_KWARGS} names {unknown}, which environment {env_class.name!r} does not declare "
            f"training-only (its training_only_kwargs: {list(training_only)})"
        )
    for name in kwargs or {}:
        if name in training_only and name not in allowed:
            hint = (how_to_allow or f"{ALLOW_TRAINING_ONLY_KWARGS}: [{{name}}]").format(name=name)
            raise ValueError(
                f"{setting}: {name!r} is a training-only kwarg of environment {env_class.name!r} (it shapes training "
                f"episodes and can give the answer away in an evaluation); leave it out, or allow it by name with "
                f"{hint}"
            )


def checked_eval_env_kwargs(
    env_name: str, kwargs: Mapping[str, Any], setting: str = "eval_env_kwargs"
) -> dict:
    """``kwargs`` of an evaluation environment of ``env_name`` (``ReflectPPOConfig.eval_env_kwargs``) after
    :func:`check_evaluation_kwargs`, with the ``allow_training_only_kwargs`` key (the training-only kwargs it allows,
    a list or a comma-separated string) taken out. An environment that cannot be loaded is left to the later checks
    (``reflect_trl.validation.check_env``)."""
    from reflect_trl.config_lists import parse_list
    from reflect_trl.envs import get_env_class

    kwargs = dict(kwargs)
    allowed = parse_list(
        kwargs.pop(ALLOW_TRAINING_ONLY_KWARGS, None), f"{setting}[{ALLOW_TRAINING_ONLY_KWARGS!r}]"
    )
    try:
        env_class = get_env_class(env_name)
    except (KeyError, ImportError):
        return kwargs
    check_evaluation_kwargs(
        env_class,
        kwargs,
        allowed,
        setting=setting,
        how_to_allow=f'"{ALLOW_TRAINING_ONLY_KWARGS}": ["{{name}}"] in {setting}',
    )
    return kwargs
