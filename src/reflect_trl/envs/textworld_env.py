"""TextWorld games (generated locally with TextWorld's own makers, or your own files) as reflect-trl environments.

:class:`TextWorldEnv` plays games made by ``textworld.challenges`` (``tw-simple``, ``tw-coin_collector``,
``tw-treasure_hunter``, ``tw-cooking``) or by ``textworld.make`` (``custom``), with difficulty settings per stage.
Generated games are cached by (challenge, settings, seed) under ``cache_dir`` (default
``$REFLECT_TRL_TEXTWORLD_CACHE`` or ``~/.cache/reflect_trl/textworld``). With ``game_files`` / ``game_dir`` it plays
existing TextWorld games instead (see :class:`TextWorldEnv`). It builds on
:class:`~reflect_trl.envs.textgame.TextGameEnv`, the engine adapter shared with ALFWorld; the names of
:mod:`reflect_trl.envs.textgame` and :mod:`reflect_trl.envs.textworld_games` (the games: settings, generation, cache,
files) are re-exported here for compatibility.

``textworld`` is imported only inside methods, so importing this module costs nothing without the extra.
"""

from __future__ import annotations

import copy
import os
import random
import re
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
from reflect_trl.envs.textworld_games import (
    CHALLENGES,
    CUSTOM_KEYS,
    DEFAULT_STAGE_LENGTHS,
    DEFAULT_STAGE_SETTINGS,
    GAME_SPLITS,
    STAGES,
    GameFile,
    check_game_file,
    default_cache_dir,
    ensure_game,
    find_game_files,
    game_content_key,
    game_key,
    playable_game,
    walkthrough_length,
)


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

    **Your own games.** ``game_files`` (a list of paths) and/or ``game_dir`` (a folder searched recursively) make
    the tasks come from existing TextWorld games (``.z8``, or ``.ulx``: its ``.z8`` twin when there is one, else a
    ``.z8`` compiled once from its ``.json`` into ``cache_dir/compiled``); each needs the ``.json`` TextWorld writes
    next to it. ``challenge`` and ``settings`` do not apply. Every other option works the same.

    * Splits (``game_split="auto"``): a file under a folder named ``train``, ``valid``/``validation`` or ``test``
      (anywhere below ``game_dir``; for ``game_files``, its own folder) belongs to that split, as in the cooking
      competition's archive; any other file goes to train / validation / test (70/20/10) by a stable hash of its
      file name (not of its folder, so moving the collection keeps the split). ``game_split="all"`` puts every
      file in every split (a pinned evaluation panel, or one game to train on).
    * Stages: by the length of the game's walkthrough (its ``.json``): up to ``stage_lengths[0]`` commands
      ``easy``, up to ``stage_lengths[1]`` ``medium``, longer (or unknown) ``hard``.
    * Tasks: ``make_tasks`` takes the split's files (of the stage asked for, or of ``stage`` when set) in a seeded
      order, repeated with new seeds when ``n`` exceeds them; a task records the file (relative to ``game_dir``
      when under it) and its seed seeds the game's random generator.
    * Oracle: the game's quest (``policy_commands``, which follows the state). A game whose ``.json`` has no quest
      plays normally, and :meth:`oracle_action` raises naming the file.
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
        game_files: Sequence[str] | str | None = None,
        game_dir: str | None = None,
        game_split: str = "auto",
        stage_lengths: Sequence[int] = DEFAULT_STAGE_LENGTHS,
    ) -> None:
        super().__init__(horizon, max_options, exclude_commands, history_steps, normalize_reward)
        missing = missing_extra_error("textworld", self.extra)
        if missing is not None:
            raise missing
        if isinstance(game_files, (str, os.PathLike)):
            game_files = [game_files]
        self.game_files = [os.fspath(f) for f in game_files or ()]
        self.game_dir = None if game_dir is None else os.fspath(game_dir)
        if game_split not in GAME_SPLITS:
            raise ValueError(f"textworld: game_split must be one of {list(GAME_SPLITS)}, got {game_split!r}")
        self.game_split = game_split
        lengths = [int(x) for x in stage_lengths]
        if len(lengths) != 2 or not 0 <= lengths[0] <= lengths[1]:
            raise ValueError(
                f"textworld: stage_lengths must be two walkthrough lengths [easy_max, medium_max] with "
                f"easy_max <= medium_max, got {list(stage_lengths)}"
            )
        self.stage_lengths = (lengths[0], lengths[1])
        if self.uses_game_files:
            if settings:
                raise ValueError(
                    "textworld: settings apply to generated games; with game_files/game_dir the games are given "
                    "(remove settings, or the game_files/game_dir)"
                )
            for path in self.game_files:  # fail now, not at the first reset
                check_game_file(path, "game_files")
            if self.game_dir is not None and not Path(self.game_dir).expanduser().is_dir():
                raise FileNotFoundError(f"textworld: game_dir {self.game_dir} is not a directory")
        self._games: list[GameFile] | None = None
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
                unknown = sorted(set(values) - set(CUSTOM_KEYS))
                if unknown:
                    raise ValueError(
                        f"textworld: unknown custom setting(s) {unknown} for stage {level!r}; known: {CUSTOM_KEYS}"
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
            "game_files": list(self.game_files),
            "game_dir": self.game_dir,
            "game_split": self.game_split,
            "stage_lengths": list(self.stage_lengths),
        }

    # -- game files ----------------------------------------------------------------------------------------
    @property
    def uses_game_files(self) -> bool:
        """True when the tasks come from ``game_files`` / ``game_dir`` rather than from the generators."""
        return bool(self.game_files) or self.game_dir is not None

    def games(self) -> list[GameFile]:
        """The given game files (found once per environment)."""
        if self._games is None:
            self._games = find_game_files(self.game_files, self.game_dir, self.game_split)
        return self._games

    def stage_of(self, game: str | Path) -> str:
        """The stage of a game file, by its walkthrough length (see the class docstring)."""
        length = walkthrough_length(game)
        if length is None:
            return self.stages[-1]
        return next(
            (s for s, top in zip(self.stages, self.stage_lengths, strict=False) if length <= top),
            self.stages[-1],
        )

    def _file_games(self, split: str, difficulty: str | None) -> list[GameFile]:
        games = [g for g in self.games() if split in g.splits]
        if difficulty is not None:
            games = [g for g in games if self.stage_of(g.location) == difficulty]
        if not games:
            given = ", ".join(
                ([f"game_files={self.game_files}"] if self.game_files else [])
                + ([f"game_dir={self.game_dir}"] if self.game_dir else [])
            )
            raise ValueError(
                f"textworld: no {split!r} game{f' of stage {difficulty!r}' if difficulty else ''} among {given} "
                f"({len(self.games())} game(s); game_split={self.game_split!r}: split folders train/valid/test, else "
                f"a hash of the file name; stage_lengths={list(self.stage_lengths)}); add games, or set "
                "game_split: all to use every file in every split"
            )
        return games

    def _file_task(self, split: str, index: int, game: GameFile, seed: int) -> Task:
        return Task(
            env=self.name,
            task_id=f"textworld-file-{split}-{index}-{game.stem}",
            difficulty=self.stage_of(game.location),
            seed=seed,
            data={"game_file": game.path},
        )

    def _file_tasks(self, split: str, n: int, seed: int, difficulty: str | None) -> list[Task]:
        games = self._file_games(split, difficulty or self.stage)
        random.Random(split_seed(seed, split, 0)).shuffle(games)
        return [
            self._file_task(split, i, games[i % len(games)], split_seed(seed, split, i)) for i in range(n)
        ]

    def _resolve_game_file(self, task: Task) -> str:
        path = Path(str(task.data["game_file"])).expanduser()
        if not path.is_absolute():
            if self.game_dir is None:
                raise ValueError(
                    f"textworld: task {task.task_id!r} names the game file {path} relative to a game_dir; set "
                    "game_dir to the folder it was made from"
                )
            path = Path(self.game_dir).expanduser() / path
        game = check_game_file(path, f"task {task.task_id!r}")
        return playable_game(game, self.cache_dir)

    # -- tasks ---------------------------------------------------------------------------------------------
    def _task(self, split: str, index: int, level: str, seed: int) -> Task:
        return Task(
            env=self.name,
            task_id=f"textworld-{self.challenge}-{split}-{level}-{index}",
            difficulty=level,
            seed=seed,
            data={"challenge": self.challenge, "settings": dict(self.stage_settings[level])},
        )

    def instance_key(self, task: Task) -> str:
        """A game file's tasks are one instance (:meth:`make_tasks` repeats the files when asked for more); a
        generated game is keyed by its content (generated first if not cached), so that two task seeds that generate
        the same game -- in training and in `test`, say -- are one instance."""
        if "game_file" in task.data:
            return str(task.data["game_file"])
        return f"textworld-{task.difficulty}-{game_content_key(self._game_file_for(task))}"

    def make_tasks(self, split: str, n: int, seed: int = 0, difficulty: str | None = None) -> list[Task]:
        """``n`` tasks with seeds ``split_seed(seed, split, i)`` (games are generated lazily, on first reset or
        :meth:`prepare`); difficulty None uses ``stage`` or cycles over the stages."""
        if split not in SPLITS:
            raise ValueError(f"textworld: unknown split {split!r}; expected one of {SPLITS}")
        if n < 0:
            raise ValueError(f"textworld: number of tasks must be >= 0, got {n}")
        if difficulty is not None:
            self.check_difficulty(difficulty)
        if self.uses_game_files:
            return self._file_tasks(split, n, seed, difficulty)
        tasks = []
        for i in range(n):
            level = difficulty or self.stage or self.stages[i % len(self.stages)]
            tasks.append(self._task(split, i, level, split_seed(seed, split, i)))
        return tasks

    def _task_for_seed(self, seed: int) -> Task:
        if self.uses_game_files:
            games = self._file_games("train", self.stage)
            game = games[random.Random(seed).randrange(len(games))]
            return self._file_task("seed", seed, game, seed)
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
        if "game_file" in task.data:
            return self._resolve_game_file(task)
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
    "GAME_SPLITS",
    "MAX_OPTIONS",
    "GameFile",
    "TextGameEnv",
    "TextWorldEnv",
    "clean_feedback",
    "default_cache_dir",
    "ensure_game",
    "find_game_files",
    "game_content_key",
    "game_key",
    "missing_extra_error",
    "playable_game",
    "require_textworld",
    "room_name",
    "seeded_global_random",
    "select_options",
    "squash",
    "step_seed",
    "walkthrough_length",
    "words",
]
