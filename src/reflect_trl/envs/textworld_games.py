"""TextWorld game files for :class:`~reflect_trl.envs.textworld_env.TextWorldEnv`: difficulty settings per challenge and
stage, games generated with TextWorld's own makers and cached by (challenge, settings, seed), and existing game files
found on disk, put into splits and stages, and made playable.

``textworld`` is imported only inside functions, so importing this module costs nothing without the extra.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from reflect_trl.envs.base import SPLITS
from reflect_trl.envs.textgame import require_textworld

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
CUSTOM_KEYS = ("world_size", "nb_objects", "quest_length", "quest_breadth", "nb_parallel_quests", "theme")
_COOKING_FLAGS = {"recipe": 1, "take": 0, "go": 1, "open": False, "cook": False, "cut": False, "drop": False}
_GENERATION_ATTEMPTS = 8  # quest generation can fail for a seed: retry with derived seeds (deterministic)

GAME_SUFFIXES = (".z8", ".ulx")
GAME_SPLITS = ("auto", "all")
#: Folder names that put the game files under them into a split (``game_split="auto"``).
SPLIT_FOLDERS = {"train": "train", "valid": "validation", "validation": "validation", "test": "test"}
#: train / validation / test shares of the hash split of game files that sit in no split folder.
FILE_SPLIT_WEIGHTS = (0.7, 0.2, 0.1)
#: Walkthrough lengths up to which a game file is ``easy`` / ``medium`` (longer or unknown: ``hard``).
DEFAULT_STAGE_LENGTHS = (5, 10)


# -- generated games -------------------------------------------------------------------------------------------
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


def game_content_key(game_file: str | Path) -> str:
    """A key of what a game poses, read from its ``.json`` beside the game file: the world's facts, its entities'
    names and texts, and the quests' commands (not the seed that generated it). Two seeds that generate the same game
    share the key."""
    path = Path(game_file).with_suffix(".json")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"textworld: cannot read the game description {path}: {err}") from None
    content = {
        "world": data.get("world"),
        "infos": data.get("infos"),
        "quests": [quest.get("commands") for quest in data.get("quests") or []],
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


# -- game files ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GameFile:
    """One game file of ``game_files`` / ``game_dir``: ``path`` as recorded in tasks (relative to ``game_dir`` when
    under it, else absolute), its absolute ``location`` and the ``splits`` it belongs to."""

    path: str
    location: str
    splits: tuple[str, ...]

    @property
    def stem(self) -> str:
        return Path(self.location).stem


def metadata_file(game: str | Path) -> Path:
    """The ``.json`` TextWorld writes next to a game (``game.z8`` -> ``game.json``)."""
    return Path(game).with_suffix(".json")


def check_game_file(path: str | Path, where: str) -> Path:
    """``path`` as an absolute game file; raises naming ``where`` (the setting) when it cannot be played."""
    game = Path(path).expanduser().resolve()
    if not game.is_file():
        raise FileNotFoundError(f"textworld: {where}: game file {path} does not exist")
    if game.suffix not in GAME_SUFFIXES:
        raise ValueError(
            f"textworld: {where}: {path} is not a TextWorld game; expected a file ending in "
            f"{' or '.join(GAME_SUFFIXES)}"
        )
    if not metadata_file(game).is_file():
        raise FileNotFoundError(
            f"textworld: {where}: {path} has no {metadata_file(game).name} next to it; reflect-trl plays games "
            "made by TextWorld (tw-make, the cooking-competition archives), whose .json holds the game logic behind "
            "the admissible commands and the quest behind the oracle: copy it next to the game"
        )
    return game


def _split_of(folders: Sequence[str], name: str, game_split: str) -> tuple[str, ...]:
    """The splits of a game file: every split (``all``), else the split folder it sits in, else a hash of its name."""
    if game_split == "all":
        return SPLITS
    for folder in reversed(folders):
        if folder.lower() in SPLIT_FOLDERS:
            return (SPLIT_FOLDERS[folder.lower()],)
    u = int(hashlib.sha256(f"textworld-split|{name}".encode()).hexdigest()[:12], 16) / float(16**12)
    if u < FILE_SPLIT_WEIGHTS[0]:
        return ("train",)
    return ("validation",) if u < FILE_SPLIT_WEIGHTS[0] + FILE_SPLIT_WEIGHTS[1] else ("test",)


def find_game_files(
    game_files: Sequence[str], game_dir: str | None, game_split: str = "auto"
) -> list[GameFile]:
    """The games of ``game_files`` and of ``game_dir`` (searched recursively), in a stable order.

    A ``.ulx`` with a ``.z8`` of the same name next to it is the same game: the ``.z8`` is kept."""
    found: dict[str, GameFile] = {}
    for path in game_files:
        game = check_game_file(path, "game_files")
        found[str(game)] = GameFile(
            str(game), str(game), _split_of([game.parent.name], game.name, game_split)
        )
    if game_dir is not None:
        root = Path(game_dir).expanduser().resolve()
        if not root.is_dir():
            raise FileNotFoundError(f"textworld: game_dir {game_dir} is not a directory")
        for folder, _dirs, files in os.walk(root):
            for name in sorted(files):
                game = Path(folder) / name
                if game.suffix not in GAME_SUFFIXES or (
                    game.suffix == ".ulx" and game.with_suffix(".z8").is_file()
                ):
                    continue
                game = check_game_file(game, f"game_dir {game_dir}")
                rel = game.relative_to(root)
                found.setdefault(
                    str(game),
                    GameFile(rel.as_posix(), str(game), _split_of(rel.parts[:-1], name, game_split)),
                )
        if not any(g.location.startswith(str(root) + os.sep) for g in found.values()):
            raise FileNotFoundError(
                f"textworld: game_dir {game_dir} holds no {' or '.join(GAME_SUFFIXES)} game; put TextWorld games "
                "(with their .json) there, e.g. made by tw-make"
            )
    return sorted(found.values(), key=lambda g: g.path)


@lru_cache(maxsize=65536)
def _walkthrough_length(metadata: str, _mtime_ns: int) -> int | None:
    with open(metadata) as f:
        data = json.load(f)
    walkthrough = (data.get("metadata") or {}).get("walkthrough")
    if isinstance(walkthrough, list):
        return len(walkthrough)
    commands = [c for quest in data.get("quests") or () for c in quest.get("commands") or ()]
    return len(commands) or None


def walkthrough_length(game: str | Path) -> int | None:
    """Number of commands of a game's walkthrough (its ``.json`` metadata, else its quests' commands; None when it
    has neither). Cached per process."""
    metadata = metadata_file(game)
    try:
        return _walkthrough_length(str(metadata), metadata.stat().st_mtime_ns)
    except (OSError, ValueError, AttributeError) as err:
        raise ValueError(f"textworld: cannot read the walkthrough of {game} from {metadata}: {err}") from err


def playable_game(game: str | Path, cache_dir: str | Path) -> str:
    """A ``.z8`` that plays ``game``: the game itself, the ``.z8`` next to a ``.ulx``, or (TextWorld 1.7 cannot run
    Glulx games) a ``.z8`` compiled from the ``.ulx``'s ``.json`` into ``cache_dir/compiled`` (once)."""
    game = Path(game)
    if game.suffix != ".ulx":
        return str(game)
    if game.with_suffix(".z8").is_file():
        return str(game.with_suffix(".z8"))
    metadata = metadata_file(game)
    key = hashlib.sha256(metadata.read_bytes()).hexdigest()[:20]
    folder = Path(cache_dir).expanduser() / "compiled"
    target = folder / f"{game.stem}-{key}.z8"
    if target.is_file() and metadata_file(target).is_file():
        return str(target)
    textworld = require_textworld()
    folder.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=folder))
    try:
        options = _game_options(textworld, 0, str(scratch / target.name))
        try:
            made = Path(textworld.generator.compile_game(textworld.Game.load(str(metadata)), options))
        except Exception as err:
            raise RuntimeError(
                f"textworld: {game} is a Glulx game, which TextWorld {textworld.__version__} cannot run, and "
                f"compiling its {metadata.name} to a .z8 failed ({type(err).__name__}: {err}); give the game's .z8 "
                "instead"
            ) from err
        os.replace(made.with_suffix(".json"), target.with_suffix(".json"))
        os.replace(made, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return str(target)


__all__ = [
    "CACHE_ENV_VAR",
    "CHALLENGES",
    "CUSTOM_KEYS",
    "DEFAULT_CACHE_DIR",
    "DEFAULT_STAGE_LENGTHS",
    "DEFAULT_STAGE_SETTINGS",
    "FILE_SPLIT_WEIGHTS",
    "GAME_SPLITS",
    "GAME_SUFFIXES",
    "GameFile",
    "SPLIT_FOLDERS",
    "STAGES",
    "check_game_file",
    "default_cache_dir",
    "ensure_game",
    "find_game_files",
    "game_content_key",
    "game_key",
    "metadata_file",
    "playable_game",
    "walkthrough_length",
]
