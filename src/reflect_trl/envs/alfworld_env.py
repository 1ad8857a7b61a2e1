"""ALFWorld's text engine (TextWorld + PDDL) as a reflect-trl environment.

Games are the ``game.tw-pddl`` files of the ALFWorld data set under ``$ALFWORLD_DATA/json_2.1.1/<split>/<task>/
<trial>/`` (next to their ``traj_data.json``), filtered by task type, target object and target receptacle. The
default filter is the Reflect-RL family: ``pick_and_place_simple`` with a tomato put in a microwave.

* Splits: ``train`` -> ``train``, ``validation`` -> ``valid_seen``, ``test`` -> ``valid_unseen`` (overridable);
  different folders, so disjoint by construction.
* Stages by task type: ``easy`` (pick and place, look at in light), ``medium`` (clean / heat / cool, then
  place), ``hard`` (two objects).
* Oracle: ALFWorld's expert (``extra.expert_plan``), the hand-coded one by default (it explores, so it never
  uses knowledge the player lacks), or ``expert="planner"`` (Fast Downward's plan, ``policy_commands``).
* A pinned task panel: ``game_list`` (a file of game paths, one per line) replaces the scan, for every split or for
  the splits it is given for (see :func:`read_game_list`).
* :meth:`ALFWorldEnv.engine_versions` / :meth:`ALFWorldEnv.card` report the ALFWorld and TextWorld versions.
* The data location is checked before any engine is created: with no games the engine's reset never returns,
  so a missing data set raises :class:`ALFWorldDataError` at once.

Observation: the opening text (room and task) plus the recent commands with the game's responses.
``alfworld`` and ``textworld`` are imported only inside methods.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from reflect_trl.envs.base import SPLITS, Task, split_seed
from reflect_trl.envs.textgame import (
    MAX_OPTIONS,
    TextGameEnv,
    missing_extra_error,
    package_version,
    require_textworld,
    squash,
)

DATA_ENV_VAR = "ALFWORLD_DATA"
DEFAULT_DATA_DIR = Path("~/.cache/alfworld")  # alfworld's own default
JSON_DIR = "json_2.1.1"
GAME_FILE = "game.tw-pddl"
TRAJ_FILE = "traj_data.json"
DEFAULT_SPLIT_DIRS = {"train": "train", "validation": "valid_seen", "test": "valid_unseen"}
TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
TASK_TYPE_STAGE = {
    "pick_and_place_simple": "easy",
    "look_at_obj_in_light": "easy",
    "pick_clean_then_place_in_recep": "medium",
    "pick_heat_then_place_in_recep": "medium",
    "pick_cool_then_place_in_recep": "medium",
    "pick_two_obj_and_place": "hard",
}
EXPERTS = ("handcoded", "planner")
_WELCOME = "-= Welcome to TextWorld, ALFRED! =-"
_HOW_TO_GET_DATA = (
    "install the extra and download the data once: pip install 'reflect-trl[alfworld]'; alfworld-download; "
    "export ALFWORLD_DATA=<the download folder> (or pass data_dir=...)"
)


class ALFWorldDataError(FileNotFoundError):
    """The ALFWorld data set (or any game matching the filters) is missing."""


def require_alfworld(data_dir: str | os.PathLike | None = None):
    """Import ``alfworld`` (and ``textworld``) or raise an ImportError that says how to install the extra.

    ``alfworld.info`` creates ``$ALFWORLD_DATA`` (default ``~/.cache/alfworld``) and exports the variable on
    import; ``data_dir`` is exported first when the variable is unset, so nothing is created elsewhere.
    """
    if data_dir is not None and not os.environ.get(DATA_ENV_VAR):
        os.environ[DATA_ENV_VAR] = str(data_dir)
    require_textworld("alfworld")
    try:
        import alfworld.agents.environment.alfred_tw_env as alfred_tw_env
    except ImportError as err:
        raise ImportError(
            f"this environment needs the optional ALFWorld package: pip install 'reflect-trl[alfworld]' "
            f"(import failed: {err})"
        ) from err
    return alfred_tw_env


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """``data_dir``, else ``$ALFWORLD_DATA``, else ``~/.cache/alfworld``."""
    return Path(data_dir or os.environ.get(DATA_ENV_VAR) or DEFAULT_DATA_DIR).expanduser()


def _game_record(game_path: str, where: str) -> dict[str, str]:
    """``game`` / ``task_type`` / ``object`` / ``receptacle`` of a game file, from its ``traj_data.json``."""
    traj_path = os.path.join(os.path.dirname(game_path), TRAJ_FILE)
    try:
        with open(traj_path) as f:
            traj = json.load(f)
        task_type = str(traj["task_type"])
        params = traj.get("pddl_params") or {}
    except (OSError, ValueError, KeyError) as err:
        raise ALFWorldDataError(f"alfworld: {where}: unreadable {traj_path}: {err}") from err
    return {
        "game": game_path,
        "task_type": task_type,
        "object": str(params.get("object_target", "")),
        "receptacle": str(params.get("parent_target", "")),
    }


def _is_solvable(game_path: str, where: str) -> bool:
    try:
        with open(game_path) as f:
            return bool(json.load(f).get("solvable"))
    except (OSError, ValueError) as err:
        raise ALFWorldDataError(f"alfworld: {where}: unreadable game file {game_path}: {err}") from err


@lru_cache(maxsize=64)
def _read_game_list(list_file: str, data_dir: str, _mtime_ns: int) -> tuple[dict[str, str], ...]:
    games = []
    with open(list_file) as f:
        lines = f.read().splitlines()
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"game_list {list_file}, line {lineno}"
        path = Path(line).expanduser()
        path = path if path.is_absolute() else Path(data_dir) / path
        if path.is_dir():
            path = path / GAME_FILE
        if not path.is_file() or not (path.parent / TRAJ_FILE).is_file():
            raise ALFWorldDataError(
                f"alfworld: {where}: {line!r} names no ALFWorld game ({path} and its {TRAJ_FILE} must exist); give "
                f"a {GAME_FILE} file or its trial folder, absolute or relative to data_dir ({data_dir})"
            )
        record = _game_record(str(path), where)
        if record["task_type"] not in TASK_TYPES:
            raise ALFWorldDataError(
                f"alfworld: {where}: {path.parent / TRAJ_FILE} has task_type {record['task_type']!r}; known: "
                f"{list(TASK_TYPES)}"
            )
        if not _is_solvable(str(path), where):
            raise ALFWorldDataError(
                f"alfworld: {where}: {path} is marked unsolvable ('solvable' is not true)"
            )
        games.append(record)
    if not games:
        raise ALFWorldDataError(
            f"alfworld: game_list {list_file} lists no game (one path per line, # comments)"
        )
    return tuple(games)


def read_game_list(list_file: str | os.PathLike, data_dir: str | os.PathLike) -> tuple[dict[str, str], ...]:
    """The games of a ``game_list`` file, in its order (cached per process until the file changes).

    One game per line: a ``game.tw-pddl`` file or its trial folder, absolute or relative to ``data_dir``; blank
    lines and lines starting with ``#`` are skipped. Every game must exist with its ``traj_data.json``, be of a
    known task type and be solvable; errors name the file and line."""
    path = Path(list_file).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"alfworld: game_list file {list_file} does not exist")
    return _read_game_list(str(path.resolve()), str(Path(data_dir).expanduser()), path.stat().st_mtime_ns)


def _norm(values: Sequence[str] | str | None) -> tuple[str, ...] | None:
    if values is None:
        return None
    if isinstance(values, str):
        values = [values]
    return tuple(sorted({str(v).lower() for v in values}))


@lru_cache(maxsize=64)
def _scan_games(
    split_root: str,
    task_types: tuple[str, ...] | None,
    objects: tuple[str, ...] | None,
    receptacles: tuple[str, ...] | None,
) -> tuple[dict[str, str], ...]:
    """Solvable games under ``split_root`` that pass the filters, sorted by path (cached per process).

    Each entry: ``game`` (path), ``task_type``, ``object``, ``receptacle``. The task folder name
    (``<type>-<object>-<mrecep>-<receptacle>-<scene>``) pre-filters before any JSON is read.
    """
    found: list[dict[str, str]] = []
    for root, _dirs, files in os.walk(split_root):
        if TRAJ_FILE not in files or GAME_FILE not in files:
            continue
        if "movable" in root or "Sliced" in root:  # as alfworld itself: not supported by the text engine
            continue
        task_dir = Path(root).parent.name.split("-")
        if len(task_dir) == 5 and task_dir[0] in TASK_TYPES:
            name_type, name_obj, _, name_recep, _ = (part.lower() for part in task_dir)
            if (
                (task_types is not None and name_type not in task_types)
                or (objects is not None and name_obj not in objects)
                or (receptacles is not None and name_recep not in receptacles)
            ):
                continue
        game_path = os.path.join(root, GAME_FILE)
        record = _game_record(game_path, f"scanning {split_root}")
        if (
            (task_types is not None and record["task_type"].lower() not in task_types)
            or (objects is not None and record["object"].lower() not in objects)
            or (receptacles is not None and record["receptacle"].lower() not in receptacles)
        ):
            continue
        if not _is_solvable(game_path, f"scanning {split_root}"):
            continue
        found.append(record)
    return tuple(sorted(found, key=lambda g: g["game"]))


# -- engines ----------------------------------------------------------------------------------------------------
# Every TextWorld PDDL engine loads a private copy of Fast Downward's shared library that is never unloaded
# (about 1 MB of memory each), and parsing the domain + grammar costs about half a second. Engines are therefore
# reused: a closed (or garbage-collected) ALFWorldEnv hands its engine to this pool, and the parsed game logic is
# cached per (domain, grammar) text. Clones (one per candidate action in the data builder) stay cheap and bounded.
_IDLE_ENGINES: dict[str, list[Any]] = {}
_POOL_LIMIT = 16


@lru_cache(maxsize=16)
def _game_logic(domain: str, grammar: str) -> Any:
    """The parsed logic of a game (shared by engines; only read, apart from idempotent type registration)."""
    from textworld.envs.pddl import logic as pddl_logic

    return pddl_logic.GameLogic(domain=domain, grammar=grammar)


@lru_cache(maxsize=1)
def _pddl_engine_class() -> type:
    """TextWorld's ``PddlEnv`` with :func:`_game_logic` caching (its ``load`` otherwise mirrors upstream 1.7)."""
    from textworld.envs.pddl import PddlEnv
    from textworld.envs.pddl import logic as pddl_logic

    class CachedLogicPddlEnv(PddlEnv):
        def load(self, filename: str) -> None:
            with open(filename) as f:
                data = json.load(f)
            self._game_file = filename
            self._game_data = data
            self.walkthrough = data.get("walkthrough", None)
            self._logic = _game_logic(data["pddl_domain"], data["grammar"])
            self._pddl_state = pddl_logic.PddlState(self.downward_lib, data["pddl_problem"], self._logic)
            self._entity_infos = self._get_entity_infos()

    return CachedLogicPddlEnv


def _new_engine(expert: str, data_dir: Path) -> Any:
    """A PDDL engine wrapped as ``alfworld``'s AlfredTWEnv wraps it (demangled names, game file, expert)."""
    alfred = require_alfworld(data_dir)
    textworld = require_textworld("alfworld")
    infos = textworld.EnvInfos(
        feedback=True, won=True, admissible_commands=True, extras=["gamefile", "expert_plan"]
    )
    engine = _pddl_engine_class()(infos)
    for wrapper in (
        alfred.AlfredDemangler(shuffle=False),
        alfred.AlfredInfos,
        alfred.AlfredExpert(expert_type=expert),
    ):
        engine = wrapper(engine)
    return engine


class ALFWorldEnv(TextGameEnv):
    """ALFWorld text games, filtered by task family; see the module docstring.

    Keyword arguments (YAML-friendly): ``horizon`` (15, as in the paper), ``data_dir`` (default
    ``$ALFWORLD_DATA``), ``task_types`` (default ``["pick_and_place_simple"]``; None = all), ``objects``
    (default ``["Tomato"]``; None = any), ``receptacles`` (default ``["Microwave"]``; None = any), ``expert``
    (``handcoded`` | ``planner``), ``split_dirs`` (split -> folder under ``json_2.1.1``), ``max_options`` (62),
    ``exclude_commands`` (default ``["help"]``), ``history_steps`` (None = the whole episode, as in the paper),
    ``game_list``: a pinned task panel, either one file (its games serve every split) or a mapping split -> file
    (e.g. ``{"test": "panel.txt"}``; the other splits are scanned as usual). Listed games are used as listed: in
    the file's order (``make_tasks`` cycles through them without shuffling), with no task-type / object /
    receptacle filter (``difficulty`` still selects by task type). See :func:`read_game_list` for the format.
    """

    name = "alfworld"
    stages = ("easy", "medium", "hard")
    extra = "alfworld"
    #: ALFRED's ``checked`` (set by look / inventory / examine / open) is an effect only: no precondition, goal or
    #: grammar rule reads it, so it never changes the future and stays out of the state key.
    inert_predicates = ("checked",)

    def __init__(
        self,
        horizon: int = 15,
        data_dir: str | None = None,
        task_types: Sequence[str] | None = ("pick_and_place_simple",),
        objects: Sequence[str] | None = ("Tomato",),
        receptacles: Sequence[str] | None = ("Microwave",),
        expert: str = "handcoded",
        split_dirs: Mapping[str, str] | None = None,
        max_options: int = MAX_OPTIONS,
        exclude_commands: Sequence[str] = ("help",),
        history_steps: int | None = None,
        normalize_reward: bool = True,
        game_list: str | Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(horizon, max_options, exclude_commands, history_steps, normalize_reward)
        if isinstance(game_list, (str, os.PathLike)):
            game_list = dict.fromkeys(SPLITS, os.fspath(game_list))
        self.game_list = {str(k): os.fspath(v) for k, v in (game_list or {}).items()}
        bad_lists = sorted(set(self.game_list) - set(SPLITS))
        if bad_lists:
            raise ValueError(f"alfworld: game_list names unknown split(s) {bad_lists}; known: {SPLITS}")
        if expert not in EXPERTS:
            raise ValueError(f"alfworld: unknown expert {expert!r}; expected one of {EXPERTS}")
        self.task_types = _norm(task_types)
        unknown = sorted(set(self.task_types or ()) - set(TASK_TYPES))
        if unknown:
            raise ValueError(f"alfworld: unknown task type(s) {unknown}; known: {list(TASK_TYPES)}")
        self.objects = _norm(objects)
        self.receptacles = _norm(receptacles)
        self.expert = expert
        self.split_dirs = {**DEFAULT_SPLIT_DIRS, **dict(split_dirs or {})}
        bad_splits = sorted(set(self.split_dirs) - set(SPLITS))
        if bad_splits:
            raise ValueError(f"alfworld: split_dirs names unknown split(s) {bad_splits}; known: {SPLITS}")
        self.data_dir = resolve_data_dir(data_dir)
        self._data_dir_arg = data_dir
        self.intro = ""
        if set(self.game_list) != set(SPLITS):
            self.check_data()  # first: its message also says how to install the extra
        for split, list_file in self.game_list.items():
            if not Path(list_file).expanduser().is_file():
                raise FileNotFoundError(
                    f"alfworld: game_list for split {split!r}: file {list_file} does not exist; give a text file "
                    f"with one {GAME_FILE} path per line"
                )
        for module in ("alfworld", "textworld"):
            missing = missing_extra_error(module, self.extra)
            if missing is not None:
                raise missing

    def _init_kwargs(self) -> dict[str, Any]:
        return {
            **super()._init_kwargs(),
            "data_dir": str(self.data_dir),
            "task_types": None if self.task_types is None else list(self.task_types),
            "objects": None if self.objects is None else list(self.objects),
            "receptacles": None if self.receptacles is None else list(self.receptacles),
            "expert": self.expert,
            "split_dirs": dict(self.split_dirs),
            "game_list": dict(self.game_list) or None,
        }

    @classmethod
    def engine_versions(cls) -> dict[str, str | None]:
        """Installed ALFWorld and TextWorld versions (None when missing), for evaluation records."""
        return {"alfworld": package_version("alfworld"), **super().engine_versions()}

    # -- data ----------------------------------------------------------------------------------------------
    def check_data(self) -> Path:
        """The ``json_2.1.1`` folder; raises :class:`ALFWorldDataError` (with how to get it) when missing."""
        root = self.data_dir / JSON_DIR
        if not root.is_dir():
            source = (
                "data_dir"
                if self._data_dir_arg
                else (f"${DATA_ENV_VAR}" if os.environ.get(DATA_ENV_VAR) else "the default")
            )
            raise ALFWorldDataError(
                f"alfworld: no ALFWorld data at {root} (from {source}); {_HOW_TO_GET_DATA}"
            )
        return root

    def games(self, split: str) -> tuple[dict[str, str], ...]:
        """The games of ``split``: those of its ``game_list``, else the scanned ones that pass the filters; raises
        :class:`ALFWorldDataError` when there are none."""
        if split not in self.split_dirs:
            raise ValueError(f"alfworld: unknown split {split!r}; expected one of {SPLITS}")
        if split in self.game_list:
            return read_game_list(self.game_list[split], self.data_dir)
        split_root = self.check_data() / self.split_dirs[split]
        games = _scan_games(str(split_root), self.task_types, self.objects, self.receptacles)
        if not games:
            raise ALFWorldDataError(
                f"alfworld: no solvable game with {GAME_FILE} and {TRAJ_FILE} under {split_root} for "
                f"task_types={self.task_types}, objects={self.objects}, receptacles={self.receptacles}; "
                f"check the filters, or {_HOW_TO_GET_DATA}"
            )
        return games

    def _task(self, split: str, index: int, game: Mapping[str, str], seed: int) -> Task:
        path = Path(game["game"])
        rel = path.relative_to(self.data_dir).as_posix() if path.is_relative_to(self.data_dir) else str(path)
        trial = Path(game["game"]).parent.name
        return Task(
            env=self.name,
            task_id=f"alfworld-{split}-{index}-{trial}",
            difficulty=TASK_TYPE_STAGE.get(game["task_type"], "easy"),
            seed=seed,
            data={
                "game": rel,
                "task_type": game["task_type"],
                "object": game["object"],
                "receptacle": game["receptacle"],
            },
        )

    def instance_key(self, task: Task) -> str:
        """The task's game file: :meth:`make_tasks` repeats a split's games (with new seeds) when asked for more."""
        return str(task.data.get("game") or task.task_id)

    def make_tasks(self, split: str, n: int, seed: int = 0, difficulty: str | None = None) -> list[Task]:
        """``n`` tasks of ``split``: its filtered games in a seeded order (a ``game_list``'s in the listed order),
        repeated (with new seeds) when ``n`` exceeds their number; ``difficulty`` keeps only the games of that
        stage."""
        if split not in SPLITS:
            raise ValueError(f"alfworld: unknown split {split!r}; expected one of {SPLITS}")
        if n < 0:
            raise ValueError(f"alfworld: number of tasks must be >= 0, got {n}")
        games = list(self.games(split))
        if difficulty is not None:
            self.check_difficulty(difficulty)
            games = [g for g in games if TASK_TYPE_STAGE.get(g["task_type"]) == difficulty]
            if not games:
                raise ALFWorldDataError(
                    f"alfworld: no {split} game of stage {difficulty!r} among the filtered games "
                    f"(task_types={self.task_types}"
                    + (f", game_list {self.game_list[split]}" if split in self.game_list else "")
                    + ")"
                )
        if split not in self.game_list:
            random.Random(split_seed(seed, split, 0)).shuffle(games)
        return [self._task(split, i, games[i % len(games)], split_seed(seed, split, i)) for i in range(n)]

    def _task_for_seed(self, seed: int) -> Task:
        games = self.games("train")
        return self._task("seed", seed, games[random.Random(seed).randrange(len(games))], seed)

    def _game_file_for(self, task: Task) -> str:
        rel = task.data.get("game")
        if not rel:
            raise ValueError(f"alfworld: task {task.task_id!r} has no 'game' in its data")
        path = Path(rel) if os.path.isabs(rel) else self.data_dir / rel
        if not path.is_file() or not (path.parent / TRAJ_FILE).is_file():
            raise ALFWorldDataError(
                f"alfworld: task {task.task_id!r} needs {path} and its {TRAJ_FILE}, which are missing; "
                f"{_HOW_TO_GET_DATA}"
            )
        return str(path)

    # -- engine --------------------------------------------------------------------------------------------
    def _start_engine(self, game_file: str) -> Any:
        pool = _IDLE_ENGINES.setdefault(self.expert, [])
        engine = pool.pop() if pool else _new_engine(self.expert, self.data_dir)
        engine.load(game_file)
        return engine

    def close(self) -> None:
        """Hand the engine back to the process's pool of idle engines (a later reset or clone reuses it)."""
        engine, self._engine, self._engine_file = self._engine, None, None
        if engine is not None:
            pool = _IDLE_ENGINES.setdefault(self.expert, [])
            if len(pool) < _POOL_LIMIT:
                pool.append(engine)

    def __del__(self) -> None:
        try:  # noqa: SIM105 (plain try: at interpreter shutdown, imported modules may be gone)
            self.close()
        except Exception:
            pass

    def _plan_of(self, state: Any) -> list[str]:
        return list(state.get("extra.expert_plan") or [])

    def remaining_plan_length(self) -> int | None:
        """The planner knows the whole plan; the hand-coded expert only its next command (None)."""
        return len(self.plan()) if self.expert == "planner" else None

    def _after_reset(self) -> None:
        self.max_score = 1.0  # ALFWorld scores 1 for a won game
        self.intro = squash(str(self.state.get("feedback") or "").replace(_WELCOME, ""))

    # -- observation ---------------------------------------------------------------------------------------
    @property
    def goal(self) -> str:
        marker = "Your task is to:"
        return self.intro.split(marker, 1)[1].strip().rstrip(".") if marker in self.intro else ""

    def _render(self) -> str:
        lines = [self.intro]
        history = self.recent_history()
        if history:
            earlier = len(self.commands) - len(history)
            lines.append("Previous steps:" + (f" ({earlier} earlier not shown)" if earlier else ""))
            for command, feedback in history:
                lines.append(f"> {command}")
                lines.append(feedback or "Nothing happens.")
        if self.won:
            lines.append("The task is done.")
        return "\n".join(lines)


__all__ = [
    "ALFWorldDataError",
    "ALFWorldEnv",
    "TASK_TYPES",
    "read_game_list",
    "require_alfworld",
    "resolve_data_dir",
]
