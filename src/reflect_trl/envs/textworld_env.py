"""TextWorld games (generated locally with TextWorld's own makers) as reflect-trl environments.

Two classes live here:

* :class:`TextGameEnv` -- the shared adapter over a TextWorld engine (``textworld.start``): admissible commands as
  the sorted, capped option list, score/won/lost as reward and success, the next command of the game's own plan as
  the oracle, and ``clone()`` by replaying the episode's commands in a fresh engine (engines cannot be deep-copied).
  :class:`~reflect_trl.envs.alfworld_env.ALFWorldEnv` builds on it too.
* :class:`TextWorldEnv` -- games made by ``textworld.challenges`` (``tw-simple``, ``tw-coin_collector``,
  ``tw-treasure_hunter``, ``tw-cooking``) or by ``textworld.make`` (``custom``), with difficulty settings per stage.
  Generated games are cached by (challenge, settings, seed) under ``cache_dir`` (default
  ``$REFLECT_TRL_TEXTWORLD_CACHE`` or ``~/.cache/reflect_trl/textworld``).

``textworld`` is imported only inside methods, so importing this module costs nothing without the extra.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import json
import os
import random
import re
import shutil
import sys
import tempfile
from abc import abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from reflect_trl.envs.base import SPLITS, Observation, StepResult, Task, TextEnv, split_seed

#: The prompt builder's label count (``len(reflect_trl.prompts.DEFAULT_LABELS)``): the default option cap.
MAX_OPTIONS = 62
CACHE_ENV_VAR = "REFLECT_TRL_TEXTWORLD_CACHE"
DEFAULT_CACHE_DIR = Path("~/.cache/reflect_trl/textworld")
CHALLENGES = ("custom", "tw-simple", "tw-coin_collector", "tw-treasure_hunter", "tw-cooking")
STAGES = ("easy", "medium", "hard")

#: Difficulty settings per challenge and stage (``custom`` keys map onto ``textworld.GameOptions``; the others
#: are the challenge's own ``tw-make`` settings).
DEFAULT_STAGE_SETTINGS: dict[str, dict[str, dict[str, Any]]] = {
    "custom": {
        "easy": {"world_size": 1, "nb_objects": 2, "quest_length": 1},
        "medium": {"world_size": 2, "nb_objects": 4, "quest_length": 2},
        "hard": {"world_size": 3, "nb_objects": 6, "quest_length": 3},
    },
    "tw-simple": {
        "easy": {"rewards": "dense", "goal": "detailed", "test": False},
        "medium": {"rewards": "balanced", "goal": "detailed", "test": False},
        "hard": {"rewards": "sparse", "goal": "brief", "test": False},
    },
    "tw-coin_collector": {"easy": {"level": 1}, "medium": {"level": 3}, "hard": {"level": 5}},
    "tw-treasure_hunter": {"easy": {"level": 1}, "medium": {"level": 5}, "hard": {"level": 10}},
    "tw-cooking": {
        "easy": {"recipe": 1, "take": 1, "go": 1},
        "medium": {"recipe": 2, "take": 1, "go": 1, "open": True},
        "hard": {"recipe": 2, "take": 2, "go": 6, "open": True, "cook": True, "cut": True},
    },
}
_CUSTOM_KEYS = ("world_size", "nb_objects", "quest_length", "quest_breadth", "nb_parallel_quests", "theme")
_COOKING_FLAGS = {"recipe": 1, "take": 0, "go": 1, "open": False, "cook": False, "cut": False, "drop": False}
_GENERATION_ATTEMPTS = 8  # quest generation can fail for a seed: retry with derived seeds (deterministic)


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


def step_seed(task_seed: int, t: int) -> int:
    """The seed of the engine call at step ``t`` of an episode (same task and step -> same seed)."""
    return int.from_bytes(hashlib.sha256(f"{task_seed}/{t}".encode()).digest()[:4], "little")


def select_options(
    commands: Sequence[str], keep: Sequence[str], exclude: Sequence[str], cap: int
) -> tuple[str, ...]:
    """Sorted, de-duplicated commands without the ``exclude`` prefixes, capped at ``cap``.

    Commands in ``keep`` (the plan's next command) always stay. When pruning, ``examine ...``, ``look`` and
    ``inventory`` go first, then the alphabetically last commands.
    """

    def excluded(cmd: str) -> bool:
        return any(cmd == p or cmd.startswith(p + " ") for p in exclude)

    keep_set = [c for c in dict.fromkeys(keep) if c in commands]
    options = sorted({c for c in commands if not excluded(c)} | set(keep_set))
    if len(options) <= cap:
        return tuple(options)

    def prune_rank(cmd: str) -> tuple[int, str]:
        low_value = cmd in ("look", "inventory") or cmd.startswith("examine ")
        return (1 if low_value else 0, cmd)

    rest = sorted((c for c in options if c not in keep_set), key=prune_rank)
    chosen = set(keep_set[:cap]) | set(rest[: max(0, cap - len(keep_set))])
    return tuple(sorted(chosen))


# -- the shared engine adapter ---------------------------------------------------------------------------------
class TextGameEnv(TextEnv):
    """Adapter over one TextWorld engine (a ``textworld.core.Environment``) per episode.

    Subclasses say how to find a task's game file and start its engine, what the plan's remaining commands are,
    and how to render the observation text. The reward is the score gained by a step, divided by the game's
    maximum score when ``normalize_reward`` (so a won game returns 1 in total); ``terminated`` means won or lost.
    """

    #: The extra this environment needs (for the ImportError message).
    extra: ClassVar[str] = "textworld"

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

    def close(self) -> None:
        """Stop the game engine (a later reset starts a new one)."""
        if self._engine is not None:
            with contextlib.suppress(Exception):
                self._engine.close()
        self._engine = None
        self._engine_file = None

    # -- episode -------------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, task: Task | None = None) -> Observation:
        """Start ``task`` (or a task drawn from ``seed``); a ``seed`` given with a task replaces ``task.seed``."""
        if task is None:
            if seed is None:
                seed = self._seed_rng.randrange(2**31)
            task = self._task_for_seed(int(seed))
        else:
            if task.env != self.name:
                raise ValueError(f"{self.name}: cannot run task {task.task_id!r} of environment {task.env!r}")
            if seed is not None and int(seed) != task.seed:
                task = Task(task.env, task.task_id, task.difficulty, int(seed), dict(task.data))
        game_file = self._game_file_for(task)
        if self._engine is None or self._engine_file != game_file:
            self.close()
            self._engine = self._start_engine(game_file)
            self._engine_file = game_file
        self._seed_engine(self._engine, task.seed)
        with seeded_global_random(step_seed(task.seed, 0)):
            state = self._engine.reset()
        self.task = task
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
        with seeded_global_random(step_seed(self.task.seed, self.t + 1)):
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
        plan = self._plan_of(self.state) if not (self.won or self.lost) else []
        options = select_options(commands, plan[:1], self.exclude_commands, self.max_options)
        if not options:  # an engine with nothing to do (never seen in practice): keep the Observation valid
            options = ("look",)
        return Observation(self._render(), options)

    def recent_history(self) -> list[tuple[str, str]]:
        """(command, feedback) of the last ``history_steps`` steps (all when None)."""
        pairs = list(zip(self.commands, self.feedbacks, strict=True))
        if self.history_steps is None:
            return pairs
        return pairs[-self.history_steps :] if self.history_steps else []

    # -- oracle --------------------------------------------------------------------------------------------
    def oracle_action(self) -> int:
        """Index of the plan's next command among the current options."""
        if self.observation is None or self.state is None:
            raise RuntimeError(f"{self.name}: oracle_action() called before reset()")
        plan = self._plan_of(self.state)
        if not plan:
            raise RuntimeError(
                f"{self.name}: the game {self.game_file} has no plan left at step {self.t} "
                f"(won={self.won}, lost={self.lost}); no next command to suggest"
            )
        if plan[0] not in self.observation.actions:
            raise RuntimeError(
                f"{self.name}: the plan's next command {plan[0]!r} is not among the options "
                f"{list(self.observation.actions)} (game {self.game_file}, step {self.t})"
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
        twin.reset(task=self.task)
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


# -- TextWorld -------------------------------------------------------------------------------------------------
def default_cache_dir() -> Path:
    """``$REFLECT_TRL_TEXTWORLD_CACHE`` or ``~/.cache/reflect_trl/textworld``."""
    return Path(os.environ.get(CACHE_ENV_VAR) or DEFAULT_CACHE_DIR).expanduser()


def game_key(challenge: str, settings: Mapping[str, Any], seed: int) -> str:
    """Cache key of a generated game: a hash of challenge, settings, seed and the TextWorld version."""
    import textworld

    blob = json.dumps(
        {"challenge": challenge, "settings": dict(settings), "seed": int(seed), "tw": textworld.__version__},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _game_options(textworld: Any, seed: int, path: str) -> Any:
    options = textworld.GameOptions()
    options.seeds = int(seed)
    options.path = path
    options.file_ext = ".z8"
    options.force_recompile = True
    return options


def _make_game(challenge: str, settings: Mapping[str, Any], seed: int, path: str) -> Any:
    """Generate and compile one game to ``path`` (a ``.z8`` file with its ``.json`` next to it)."""
    textworld = require_textworld()
    from textworld.generator import QuestGenerationError

    last_error: Exception | None = None
    for attempt in range(_GENERATION_ATTEMPTS):
        attempt_seed = (int(seed) + attempt * 1_000_003) % (2**31)
        options = _game_options(textworld, attempt_seed, path)
        try:
            if challenge == "custom":
                options.nb_rooms = int(settings["world_size"])
                options.nb_objects = int(settings["nb_objects"])
                options.quest_length = int(settings["quest_length"])
                options.nb_parallel_quests = int(settings.get("nb_parallel_quests", 1))
                if "quest_breadth" in settings:
                    options.quest_breadth = int(settings["quest_breadth"])
                if "theme" in settings:
                    options.grammar.theme = str(settings["theme"])
                game_file, _ = textworld.make(options)
                return game_file
            _, make, _ = textworld.challenges.CHALLENGES[challenge]
            challenge_settings = dict(settings)
            if challenge == "tw-cooking":
                challenge_settings = {**_COOKING_FLAGS, "split": None, **challenge_settings}
                challenge_settings.setdefault("recipe_seed", attempt_seed)
            game = make(settings=challenge_settings, options=options)
            return textworld.generator.compile_game(game, options)
        except QuestGenerationError as err:
            last_error = err
    raise RuntimeError(
        f"textworld: no {challenge!r} game could be generated with settings {dict(settings)} from seed {seed} "
        f"({_GENERATION_ATTEMPTS} attempts); relax the settings. Last error: {last_error}"
    )


def ensure_game(challenge: str, settings: Mapping[str, Any], seed: int, cache_dir: str | Path) -> str:
    """Path of the cached game for (challenge, settings, seed), generating it first if needed.

    Generation happens in a private temporary folder inside the cache and is moved into place at the end, so
    parallel processes never see half-written games.
    """
    require_textworld()
    cache = Path(cache_dir).expanduser()
    folder = cache / challenge
    key = game_key(challenge, settings, seed)
    target = folder / f"{key}.z8"
    if target.is_file() and target.with_suffix(".json").is_file():
        return str(target)
    folder.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=folder))
    try:
        made = Path(_make_game(challenge, settings, seed, str(scratch / f"{key}.z8")))
        os.replace(made.with_suffix(".json"), target.with_suffix(".json"))
        os.replace(made, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return str(target)


class TextWorldEnv(TextGameEnv):
    """Locally generated TextWorld games; stages ``easy``/``medium``/``hard`` map to the challenge's settings.

    Keyword arguments (YAML-friendly):

    * ``challenge``: ``custom`` (``world_size``, ``nb_objects``, ``quest_length``, optional ``quest_breadth``,
      ``nb_parallel_quests``, ``theme``), ``tw-simple`` (``rewards``, ``goal``, ``test``), ``tw-coin_collector`` /
      ``tw-treasure_hunter`` (``level``), ``tw-cooking`` (``recipe``, ``take``, ``go``, ``open``, ``cook``, ``cut``,
      ``drop``, ``recipe_seed``);
    * ``settings``: per-stage overrides merged over :data:`DEFAULT_STAGE_SETTINGS`, e.g. ``{"easy": {"world_size": 2}}``;
    * ``stage``: the stage used by ``make_tasks(difficulty=None)`` and seed-only resets (None: tasks cycle over the
      stages, seed-only resets use ``easy``);
    * ``cache_dir``: where generated games are kept (default ``$REFLECT_TRL_TEXTWORLD_CACHE`` or
      ``~/.cache/reflect_trl/textworld``);
    * ``show_description`` / ``show_inventory``: include the room description / inventory in the observation;
    * ``max_options`` (default 62, the number of option labels), ``exclude_commands`` (command prefixes to hide,
      e.g. ``["examine", "look"]``; the plan's next command always stays), ``history_steps`` (recent commands
      listed), ``normalize_reward`` (score gained / max score).

    A task's ``data`` carries the challenge and its resolved settings, so a saved task replays the same game.
    """

    name = "textworld"
    stages = STAGES

    def __init__(
        self,
        horizon: int = 20,
        challenge: str = "custom",
        settings: Mapping[str, Mapping[str, Any]] | None = None,
        stage: str | None = None,
        cache_dir: str | None = None,
        show_description: bool = True,
        show_inventory: bool = True,
        max_options: int = MAX_OPTIONS,
        exclude_commands: Sequence[str] = (),
        history_steps: int | None = 5,
        normalize_reward: bool = True,
    ) -> None:
        super().__init__(horizon, max_options, exclude_commands, history_steps, normalize_reward)
        missing = missing_extra_error("textworld", self.extra)
        if missing is not None:
            raise missing
        if challenge not in CHALLENGES:
            raise ValueError(f"textworld: unknown challenge {challenge!r}; known: {list(CHALLENGES)}")
        self.challenge = challenge
        self.settings_override = {str(k): dict(v) for k, v in (settings or {}).items()}
        for key in self.settings_override:
            self.check_difficulty(key)
        self.stage_settings = {
            level: {**DEFAULT_STAGE_SETTINGS[challenge][level], **self.settings_override.get(level, {})}
            for level in self.stages
        }
        if challenge == "custom":
            for level, values in self.stage_settings.items():
                unknown = sorted(set(values) - set(_CUSTOM_KEYS))
                if unknown:
                    raise ValueError(
                        f"textworld: unknown custom setting(s) {unknown} for stage {level!r}; known: {_CUSTOM_KEYS}"
                    )
        self.stage = None if stage is None else self.check_difficulty(stage)
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        self.show_description = bool(show_description)
        self.show_inventory = bool(show_inventory)

    def _init_kwargs(self) -> dict[str, Any]:
        return {
            **super()._init_kwargs(),
            "challenge": self.challenge,
            "settings": copy.deepcopy(self.settings_override),
            "stage": self.stage,
            "cache_dir": str(self.cache_dir),
            "show_description": self.show_description,
            "show_inventory": self.show_inventory,
        }

    # -- tasks ---------------------------------------------------------------------------------------------
    def _task(self, split: str, index: int, level: str, seed: int) -> Task:
        return Task(
            env=self.name,
            task_id=f"textworld-{self.challenge}-{split}-{level}-{index}",
            difficulty=level,
            seed=seed,
            data={"challenge": self.challenge, "settings": dict(self.stage_settings[level])},
        )

    def make_tasks(self, split: str, n: int, seed: int = 0, difficulty: str | None = None) -> list[Task]:
        """``n`` tasks with seeds ``split_seed(seed, split, i)`` (games are generated lazily, on first reset or
        :meth:`prepare`); difficulty None uses ``stage`` or cycles over the stages."""
        if split not in SPLITS:
            raise ValueError(f"textworld: unknown split {split!r}; expected one of {SPLITS}")
        if n < 0:
            raise ValueError(f"textworld: number of tasks must be >= 0, got {n}")
        if difficulty is not None:
            self.check_difficulty(difficulty)
        tasks = []
        for i in range(n):
            level = difficulty or self.stage or self.stages[i % len(self.stages)]
            tasks.append(self._task(split, i, level, split_seed(seed, split, i)))
        return tasks

    def _task_for_seed(self, seed: int) -> Task:
        level = self.stage or self.stages[0]
        task = self._task("seed", seed, level, seed)
        return Task(task.env, f"textworld-{self.challenge}-seed{seed}-{level}", level, seed, task.data)

    def game_settings(self, task: Task) -> tuple[str, dict[str, Any]]:
        """(challenge, settings) of a task: from its ``data`` when recorded there, else from its difficulty."""
        challenge = str(task.data.get("challenge", self.challenge))
        if challenge not in CHALLENGES:
            raise ValueError(f"textworld: task {task.task_id!r} names unknown challenge {challenge!r}")
        if "settings" in task.data:
            return challenge, dict(task.data["settings"])
        level = self.check_difficulty(task.difficulty)
        if challenge == self.challenge:
            return challenge, dict(self.stage_settings[level])
        return challenge, dict(DEFAULT_STAGE_SETTINGS[challenge][level])

    def _game_file_for(self, task: Task) -> str:
        challenge, settings = self.game_settings(task)
        return ensure_game(challenge, settings, task.seed, self.cache_dir)

    def prepare(self, tasks: Sequence[Task]) -> list[str]:
        """Generate (or find in the cache) the game file of every task; returns their paths."""
        return [self._game_file_for(task) for task in tasks]

    # -- engine --------------------------------------------------------------------------------------------
    def _start_engine(self, game_file: str) -> Any:
        textworld = require_textworld(self.extra)
        infos = textworld.EnvInfos(
            feedback=True,
            description=True,
            inventory=True,
            objective=True,
            admissible_commands=True,
            policy_commands=True,
            score=True,
            max_score=True,
            won=True,
            lost=True,
        )
        return textworld.start(game_file, infos)

    def _seed_engine(self, engine: Any, seed: int) -> None:
        engine.seed(1 + int(seed) % 32767)  # the Z-machine's RNG (0/None would mean "seed from the clock")

    def _plan_of(self, state: Any) -> list[str]:
        return list(state.get("policy_commands") or [])

    def _clean_step_feedback(self, state: Any) -> str:
        feedback = clean_feedback(state.get("feedback"))
        description = squash(state.get("description"))
        if description and description in feedback:  # moving/looking repeats the room description
            room = room_name(state.get("description")) or "room"
            feedback = squash(feedback.replace(description, f"You see the {room} (described below)."))
        return feedback

    # -- observation ---------------------------------------------------------------------------------------
    @property
    def goal(self) -> str:
        return squash(self.state.get("objective")) if self.state is not None else ""

    def _render(self) -> str:
        state = self.state
        lines = [f"Goal: {self.goal}"] if self.goal else []
        history = self.recent_history()
        if history:
            shown = "; ".join(cmd for cmd, _ in history)
            earlier = len(self.commands) - len(history)
            lines.append(f"Commands so far: {'... ; ' if earlier else ''}{shown}")
            lines.append(f"Last result: {self.last_feedback or 'nothing happened.'}")
        if self.show_description:
            description = state.get("description") or ""
            room = room_name(description)
            body = squash(re.sub(r"^\s*-=.*?=-", "", description, count=1))
            lines.append(f"Location: {room + '. ' if room else ''}{body}".rstrip())
        if self.show_inventory:
            lines.append(f"Inventory: {squash(state.get('inventory')) or 'unknown'}")
        lines.append(f"Score: {self.score:g} of {self.max_score:g}. Step {self.t} of {self.horizon}.")
        if self.won:
            lines.append("The game is won.")
        elif self.lost:
            lines.append("The game is lost.")
        return "\n".join(lines)


__all__ = [
    "CHALLENGES",
    "DEFAULT_STAGE_SETTINGS",
    "MAX_OPTIONS",
    "TextGameEnv",
    "TextWorldEnv",
    "clean_feedback",
    "default_cache_dir",
    "ensure_game",
    "game_key",
    "missing_extra_error",
    "require_textworld",
    "seeded_global_random",
    "select_options",
]
