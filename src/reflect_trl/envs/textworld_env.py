"""TextWorld games (generated locally with TextWorld's own makers) as reflect-trl environments.

:class:`TextWorldEnv` plays games made by ``textworld.challenges`` (``tw-simple``, ``tw-coin_collector``,
``tw-treasure_hunter``, ``tw-cooking``) or by ``textworld.make`` (``custom``), with difficulty settings per stage.
Generated games are cached by (challenge, settings, seed) under ``cache_dir`` (default
``$REFLECT_TRL_TEXTWORLD_CACHE`` or ``~/.cache/reflect_trl/textworld``). It builds on
:class:`~reflect_trl.envs.textgame.TextGameEnv`, the engine adapter shared with ALFWorld; the names of
:mod:`reflect_trl.envs.textgame` are re-exported here for compatibility.

``textworld`` is imported only inside methods, so importing this module costs nothing without the extra.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reflect_trl.envs.base import SPLITS, Task, split_seed
from reflect_trl.envs.textgame import (
    MAX_OPTIONS,
    TextGameEnv,
    clean_feedback,
    missing_extra_error,
    require_textworld,
    room_name,
    seeded_global_random,
    select_options,
    squash,
    step_seed,
    words,
)

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
    "room_name",
    "seeded_global_random",
    "select_options",
    "squash",
    "step_seed",
    "words",
]
