"""The generic text-game base shared by TextWorld and ALFWorld.

:class:`TextGameEnv` is the adapter over a TextWorld engine (``textworld.start``): admissible commands as the
sorted, capped option list, score/won/lost as reward and success, the next command of the game's own plan as the
oracle, ``state_key()`` from the engine's world state, and ``clone()`` by replaying the episode's commands in a fresh
engine (engines cannot be deep-copied).
:class:`~reflect_trl.envs.textworld_env.TextWorldEnv` and :class:`~reflect_trl.envs.alfworld_env.ALFWorldEnv`
build on it. The helpers here clean game text, select options and seed the engine calls.

``textworld`` is imported only inside functions, so importing this module costs nothing without the extra.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import random
import re
import sys
from abc import abstractmethod
from collections.abc import Hashable, Iterator, Sequence
from typing import Any, ClassVar

from reflect_trl.envs.base import Observation, OracleUnavailableError, StepResult, Task, TextEnv

#: The prompt builder's label count (``len(reflect_trl.prompts.DEFAULT_LABELS)``): the default option cap.
MAX_OPTIONS = 62


def missing_extra_error(module: str, extra: str) -> ImportError | None:
    """An ImportError naming the extra to install when ``module`` cannot be imported (checked without
    importing it), else None."""
    if module in sys.modules:
        found = sys.modules[module] is not None
    else:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
    if found:
        return None
    return ImportError(
        f"this environment needs the optional {module!r} package: pip install 'reflect-trl[{extra}]'"
    )


def require_textworld(extra: str = "textworld"):
    """Import ``textworld`` or raise an ImportError that says how to install the extra."""
    try:
        import textworld
        import textworld.challenges  # noqa: F401  (registers the challenges)
    except ImportError as err:
        raise ImportError(
            f"this environment needs the optional TextWorld package: pip install 'reflect-trl[{extra}]' "
            f"(import failed: {err})"
        ) from err
    return textworld


# -- text clean-up -------------------------------------------------------------------------------------------
_GAME_OVER_MARKERS = ("*** The End ***", "*** You lost! ***", "Would you like to RESTART")


def squash(text: str | None) -> str:
    """Collapse all whitespace to single spaces."""
    return " ".join((text or "").split())


def clean_feedback(text: str | None) -> str:
    """A game response without the end-of-game banner, restart prompt and status line, on one line."""
    text = text or ""
    for marker in _GAME_OVER_MARKERS:
        text = text.split(marker, 1)[0]
    lines = [line for line in text.splitlines() if line.strip() not in (">", "")]
    lines = [line for line in lines if not re.fullmatch(r"\s*>?\s*-= .* =-\s*\d+/\d+\s*", line)]
    return squash(" ".join(lines)).rstrip(">").strip()


def room_name(description: str | None) -> str:
    """``Kitchen`` from a room description that starts with ``-= Kitchen =-`` ('' when there is none)."""
    match = re.match(r"\s*-=\s*(.+?)\s*=-", description or "")
    return match.group(1) if match else ""


def words(text: str, limit: int) -> str:
    """At most ``limit`` words of ``text`` (with an ellipsis when cut)."""
    parts = text.split()
    return " ".join(parts) if len(parts) <= limit else " ".join(parts[:limit]) + " ..."


@contextlib.contextmanager
def seeded_global_random(seed: int) -> Iterator[None]:
    """Run a block with Python's global ``random`` seeded (ALFWorld's expert draws from it), then restore it."""
    saved = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(saved)


def step_seed(seed: int, t: int) -> int:
    """The seed of the engine call at step ``t`` of an episode (same seed and step -> same seed)."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{t}".encode()).digest()[:4], "little")


def package_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (None when it is not installed); imports nothing."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def world_digest(state: Any, options: Sequence[str], inert: Sequence[str] = ()) -> str:
    """A SHA-256 digest of what an engine state holds about the world (see :meth:`TextGameEnv.state_key`); facts of
    the ``inert`` predicates are left out."""

    def counts(fact: Any) -> bool:
        # A PDDL engine's fact mirror keeps "not_X" for every X an action deleted: residue of the past (the absence
        # of X already says it), so only the positive facts count.
        name = str(getattr(fact, "name", ""))
        return not name.startswith("not_") and name not in inert

    facts = sorted(str(f) for f in state.get("_facts") or () if counts(f))
    progression = state.get("_game_progression")
    quests = [
        (q.completed, q.failed, q.unfinishable, q.nb_completions)
        for q in (progression.quest_progressions if progression is not None else ())
    ]
    parts = {
        "facts": facts,
        "description": state.get("description"),
        "inventory": state.get("inventory"),
        "score": state.get("score"),
        "won": bool(state.get("won")),
        "lost": bool(state.get("lost")),
        "quests": quests,
        "options": list(options),
    }
    return hashlib.sha256(repr(sorted(parts.items())).encode()).hexdigest()


def select_options(commands: Sequence[str], exclude: Sequence[str], cap: int) -> tuple[str, ...]:
    """Sorted, de-duplicated commands without the ``exclude`` prefixes, capped at ``cap``; when pruning,
    ``examine ...``, ``look`` and ``inventory`` go first, then the alphabetically last commands.

    The choice never looks at the plan: a plan command that this pruning removes makes the oracle unavailable for
    that state (:class:`~reflect_trl.envs.base.OracleUnavailableError`), instead of being the one command of its kind
    left in the prompt (which would tell the policy the answer).
    """

    def excluded(cmd: str) -> bool:
        return any(cmd == p or cmd.startswith(p + " ") for p in exclude)

    options = sorted({c for c in commands if not excluded(c)})
    if len(options) <= cap:
        return tuple(options)

    def prune_rank(cmd: str) -> tuple[int, str]:
        low_value = cmd in ("look", "inventory") or cmd.startswith("examine ")
        return (1 if low_value else 0, cmd)

    return tuple(sorted(sorted(options, key=prune_rank)[:cap]))


# -- the shared engine adapter ---------------------------------------------------------------------------------
class TextGameEnv(TextEnv):
    """Adapter over one TextWorld engine (a ``textworld.core.Environment``) per episode.

    Subclasses say how to find a task's game file and start its engine, what the plan's remaining commands are,
    and how to render the observation text. The reward is the score gained by a step, divided by the game's
    maximum score when ``normalize_reward`` (so a won game returns 1 in total); ``terminated`` means won or lost.

    Seeds: the task (``task.seed`` included) fixes the game and its opening (the engine's own generator is seeded
    from ``task.seed`` before the reset), so every episode of a task plays the same game from the same state; the
    ``seed`` given to :meth:`reset` (default ``task.seed``) only seeds the per-step randomness (``step_seed``:
    ALFWorld's feedback wording and its hand-coded expert draw from Python's global ``random``).
    """

    #: The extra this environment needs (for the ImportError message).
    extra: ClassVar[str] = "textworld"
    #: Predicates that no action, goal or text ever reads (bookkeeping): left out of :meth:`state_key`.
    inert_predicates: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        horizon: int = 20,
        max_options: int = MAX_OPTIONS,
        exclude_commands: Sequence[str] = (),
        history_steps: int | None = 5,
        normalize_reward: bool = True,
    ) -> None:
        super().__init__(horizon)
        if int(max_options) < 1:
            raise ValueError(f"{self.name}: max_options must be >= 1, got {max_options}")
        if history_steps is not None and int(history_steps) < 0:
            raise ValueError(f"{self.name}: history_steps must be >= 0 or None, got {history_steps}")
        self.max_options = int(max_options)
        self.exclude_commands = tuple(str(c) for c in exclude_commands)
        self.history_steps = None if history_steps is None else int(history_steps)
        self.normalize_reward = bool(normalize_reward)
        self._engine: Any = None
        self._engine_file: str | None = None
        self.game_file: str | None = None
        self.episode_seed = 0  # seeds the per-step randomness of the current episode
        self.state: Any = None  # the engine's latest GameState
        self.commands: list[str] = []  # commands taken this episode
        self.feedbacks: list[str] = []  # cleaned game response to each command
        self.score = 0.0
        self.max_score = 0.0
        self.won = False
        self.lost = False
        self._seed_rng = random.Random(0)  # seeds for reset() without seed or task

    # -- subclass hooks ------------------------------------------------------------------------------------
    @abstractmethod
    def _task_for_seed(self, seed: int) -> Task:
        """A task drawn from ``seed`` (reset without a task)."""

    @abstractmethod
    def _game_file_for(self, task: Task) -> str:
        """Path of the task's game file (generated/located as needed, never an engine start)."""

    @abstractmethod
    def _start_engine(self, game_file: str) -> Any:
        """A loaded TextWorld engine for ``game_file`` (reset is called by the caller)."""

    @abstractmethod
    def _plan_of(self, state: Any) -> list[str]:
        """The plan's remaining commands in engine state ``state`` (first = next)."""

    @abstractmethod
    def _render(self) -> str:
        """The observation text of the current state (never the options list)."""

    def _seed_engine(self, engine: Any, seed: int) -> None:
        """Seed the engine's own random generator before a reset (no-op by default)."""

    # -- public helpers ------------------------------------------------------------------------------------
    @property
    def goal(self) -> str:
        """The game's objective text ('' when unknown)."""
        return ""

    @property
    def last_feedback(self) -> str:
        """The cleaned game response to the last command ('' at the start of an episode)."""
        return self.feedbacks[-1] if self.feedbacks else ""

    def plan(self) -> list[str]:
        """The plan's remaining commands from the current state (first = what :meth:`oracle_action` picks)."""
        if self.state is None:
            raise RuntimeError(f"{self.name}: plan() called before reset()")
        return list(self._plan_of(self.state))

    def remaining_plan_length(self) -> int | None:
        """Number of commands left in the plan, or None when the plan source only knows the next command."""
        return len(self.plan())

    @classmethod
    def engine_versions(cls) -> dict[str, str | None]:
        """Installed versions of the game engine packages (None when missing), for evaluation records."""
        return {"textworld": package_version("textworld")}

    def card(self) -> dict[str, Any]:
        """What an evaluation should record about this environment: its settings and the engine versions."""
        return {"env": self.name, "settings": self._init_kwargs(), "versions": self.engine_versions()}

    def close(self) -> None:
        """Stop the game engine (a later reset starts a new one)."""
        if self._engine is not None:
            with contextlib.suppress(Exception):
                self._engine.close()
        self._engine = None
        self._engine_file = None

    # -- episode -------------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, task: Task | None = None) -> Observation:
        """Start ``task`` (or a task drawn from ``seed``). The game comes from the task alone; ``seed`` (default
        ``task.seed``) seeds the episode's per-step randomness (see the class docstring)."""
        if task is None:
            if seed is None:
                seed = self._seed_rng.randrange(2**31)
            task = self._task_for_seed(int(seed))
        elif task.env != self.name:
            raise ValueError(f"{self.name}: cannot run task {task.task_id!r} of environment {task.env!r}")
        game_file = self._game_file_for(task)
        if self._engine is None or self._engine_file != game_file:
            self.close()
            self._engine = self._start_engine(game_file)
            self._engine_file = game_file
        self._seed_engine(self._engine, task.seed)
        with seeded_global_random(step_seed(task.seed, 0)):
            state = self._engine.reset()
        self.task = task
        self.episode_seed = task.seed if seed is None else int(seed)
        self.game_file = game_file
        self.state = state
        self.commands, self.feedbacks = [], []
        self.score = float(state.get("score") or 0)
        self.max_score = float(state.get("max_score") or 0)
        self.won = bool(state.get("won"))
        self.lost = bool(state.get("lost"))
        self.t = 0
        self.done = False
        self._after_reset()
        self.observation = self._observe()
        return self.observation

    def _after_reset(self) -> None:
        """Hook run after the engine reset, before the first observation is rendered."""

    def step(self, action_index: int) -> StepResult:
        index = self._check_action(action_index)
        assert self.observation is not None and self.task is not None
        command = self.observation.actions[index]
        previous_score = self.score
        with seeded_global_random(step_seed(self.episode_seed, self.t + 1)):
            state, score, game_over = self._engine.step(command)
        self.t += 1
        self.state = state
        self.commands.append(command)
        self.feedbacks.append(self._clean_step_feedback(state))
        self.score = float(score or 0)
        self.max_score = float(state.get("max_score") or self.max_score)
        self.won = bool(state.get("won"))
        self.lost = bool(state.get("lost"))
        terminated = bool(self.won or self.lost or game_over)
        truncated = not terminated and self.t >= self.horizon
        self.done = terminated or truncated
        gained = self.score - previous_score
        reward = gained / self.max_score if self.normalize_reward and self.max_score > 0 else gained
        self.observation = self._observe()
        info = {
            "success": self.won,
            "won": self.won,
            "lost": self.lost,
            "score": self.score,
            "max_score": self.max_score,
            "command": command,
            "feedback": self.last_feedback,
        }
        return self.observation, float(reward), terminated, truncated, info

    def _clean_step_feedback(self, state: Any) -> str:
        return clean_feedback(state.get("feedback"))

    def _observe(self) -> Observation:
        commands = list(self.state.get("admissible_commands") or [])
        options = select_options(commands, self.exclude_commands, self.max_options)
        if not options:  # an engine with nothing to do (never seen in practice): keep the Observation valid
            options = ("look",)
        return Observation(self._render(), options)

    def recent_history(self) -> list[tuple[str, str]]:
        """(command, feedback) of the last ``history_steps`` steps (all when None)."""
        pairs = list(zip(self.commands, self.feedbacks, strict=True))
        if self.history_steps is None:
            return pairs
        return pairs[-self.history_steps :] if self.history_steps else []

    # -- Markov state --------------------------------------------------------------------------------------
    def state_key(self) -> Hashable:
        """``(env, task id, task seed, world digest)``: the game, and a SHA-256 digest of the engine's world state.

        The task id and seed name the game (and its opening text). The digest covers the engine's world facts
        (``_facts``: every proposition that is true, so location, inventory, open/closed/locked, where each
        object is; not the ``not_X`` entries a PDDL engine keeps for facts deleted in the past, nor the facts of
        :attr:`inert_predicates`), the per-quest progression (completed / failed / unfinishable: TextWorld scores
        a quest once, so a quest undone again still differs from one never done), the score, won/lost, the room
        description and inventory texts as the engine renders them (a Z-machine lists objects in the order they
        arrived, so the same facts can read differently in every later observation), and the current options
        (the hand-coded ALFWorld expert's plan depends on its exploration history).

        Left out, as history: the commands so far, their responses and the last response (it is replaced by the
        response to the next command, which the world state and that command decide), the step counter, and the
        episode seed (it only varies the wording of responses). Cost: one sort of the fact strings and one hash
        (well under a millisecond for the games here)."""
        if self.task is None or self.state is None or self.observation is None:
            raise RuntimeError(f"{self.name}: state_key() called before reset()")
        digest = world_digest(self.state, self.observation.actions, self.inert_predicates)
        return (self.name, self.task.task_id, self.task.seed, digest)

    # -- oracle --------------------------------------------------------------------------------------------
    def oracle_action(self) -> int:
        """Index of the plan's next command among the current options."""
        if self.observation is None or self.state is None:
            raise RuntimeError(f"{self.name}: oracle_action() called before reset()")
        plan = self._plan_of(self.state)
        if not plan and self.t == 0 and not (self.won or self.lost):
            raise RuntimeError(
                f"{self.name}: the game file {self.game_file} carries no walkthrough (no quest with a winning "
                "policy), so there is no oracle for it; the oracle is needed by data generation, oracle "
                "reflections and the oracle policy of `eval`. Play it with a model policy, or give a game made "
                "with a quest (e.g. by tw-make)"
            )
        if not plan:
            raise RuntimeError(
                f"{self.name}: the game {self.game_file} has no plan left at step {self.t} "
                f"(won={self.won}, lost={self.lost}); no next command to suggest"
            )
        if plan[0] not in self.observation.actions:
            raise OracleUnavailableError(
                f"{self.name}: the plan's next command {plan[0]!r} is not among the options "
                f"{list(self.observation.actions)} (game {self.game_file}, step {self.t}): exclude_commands "
                f"{list(self.exclude_commands)} or max_options {self.max_options} pruned it"
            )
        return self.observation.actions.index(plan[0])

    # -- copies --------------------------------------------------------------------------------------------
    def _init_kwargs(self) -> dict[str, Any]:
        """Constructor keyword arguments that rebuild an equivalent environment (for :meth:`clone`)."""
        return {
            "horizon": self.horizon,
            "max_options": self.max_options,
            "exclude_commands": list(self.exclude_commands),
            "history_steps": self.history_steps,
            "normalize_reward": self.normalize_reward,
        }

    def clone(self) -> TextGameEnv:
        """An independent copy at the same state: a fresh engine replays this episode's commands.

        The copy can be stepped (e.g. to test whether a candidate action ends the episode) without touching
        this environment. Raises RuntimeError if the replay does not reproduce the current observation.
        """
        twin = type(self)(**self._init_kwargs())
        twin._seed_rng.setstate(self._seed_rng.getstate())
        if self.task is None or self.observation is None:
            return twin
        twin.reset(seed=self.episode_seed, task=self.task)
        for command in self.commands:
            if twin.done:
                break
            twin.step(twin.observation.actions.index(command))
        twin.t, twin.done = self.t, self.done
        if twin.observation != self.observation or twin.commands != self.commands:
            twin.close()
            raise RuntimeError(
                f"{self.name}: replaying {len(self.commands)} command(s) of {self.game_file} did not reproduce "
                "the current state; the game is not deterministic"
            )
        return twin

    def __deepcopy__(self, memo: dict[int, Any]) -> TextGameEnv:
        return self.clone()


__all__ = [
    "MAX_OPTIONS",
    "TextGameEnv",
    "clean_feedback",
    "missing_extra_error",
    "package_version",
    "require_textworld",
    "room_name",
    "seeded_global_random",
    "select_options",
    "squash",
    "step_seed",
    "words",
    "world_digest",
]
