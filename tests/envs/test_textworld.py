"""TextWorldEnv: locally generated games and game files made by tw-make, played through the TextEnv interface, and
their state keys (needs the [textworld] extra, except the checks of the lazy import and of the option selection)."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reflect_trl.envs.base import Observation
from reflect_trl.envs.textgame import MAX_OPTIONS, clean_feedback, select_options
from reflect_trl.prompts import DEFAULT_LABELS

# Jericho warns that TextWorld's generated games are "not fully supported" (score detection); TextWorld tracks
# the score itself.
pytestmark = pytest.mark.filterwarnings("ignore:Game .* is not fully supported")

SMALL = {"easy": {"world_size": 1, "nb_objects": 2, "quest_length": 1}, "medium": {"world_size": 2}}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    """One game cache per test session (the reflector tests use the same folder, so games are made once)."""
    pytest.importorskip("textworld")
    path = tmp_path_factory.getbasetemp() / "textworld-game-cache"
    path.mkdir(exist_ok=True)
    return str(path)


def make(cache_dir: str, **kwargs):
    from reflect_trl.envs import make_env

    return make_env("textworld", cache_dir=cache_dir, settings=SMALL, **kwargs)


def play(env, task, policy) -> tuple[list, float, dict]:
    """Run one episode; ``policy(env, obs)`` returns an action index. Returns the trace, return and last info."""
    obs = env.reset(task=task)
    trace, total, info = [(obs.text, obs.actions)], 0.0, {}
    while not env.done:
        obs, reward, terminated, truncated, info = env.step(policy(env, obs))
        total += reward
        trace.append((obs.text, obs.actions, reward, terminated, truncated, info["success"]))
    return trace, total, info


# -- no extra needed -------------------------------------------------------------------------------------------
def test_module_import_is_lazy_and_missing_extra_is_explained():
    code = (
        "import sys\n"
        "import reflect_trl.envs.textworld_env as m\n"
        "assert 'textworld' not in sys.modules, 'textworld imported eagerly'\n"
        "sys.modules['textworld'] = None  # simulate the extra being absent\n"
        "try:\n"
        "    m.TextWorldEnv(cache_dir='unused')\n"
        "except ImportError as err:\n"
        "    print(err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install 'reflect-trl[textworld]'" in out.stdout


def test_select_options_sorts_excludes_and_caps_without_the_plan():
    """The options depend on the admissible commands and the settings alone: a command the plan needs is pruned
    like any other (it used to be kept -- the one ``examine`` left in a prompt that excludes ``examine``)."""
    commands = [f"take item {i:02d}" for i in range(80)] + ["examine box", "look", "go east", "help"]
    options = select_options(commands, exclude=["help"], cap=MAX_OPTIONS)
    assert len(options) == MAX_OPTIONS == len(DEFAULT_LABELS)
    assert list(options) == sorted(options)
    assert "take item 79" not in options and "help" not in options  # the alphabetically last go past the cap
    assert "look" not in options and "examine box" not in options  # low-value commands are pruned first
    assert select_options(["b", "a", "a"], exclude=[], cap=5) == ("a", "b")
    assert select_options(["look", "examine x", "examine y"], exclude=["examine"], cap=5) == ("look",)


def test_clean_feedback_strips_end_banner_and_prompt():
    raw = (
        "You pick up the coin from the ground.\n\n\n\nYour score has just gone up by one point.\n\n\n"
        "      *** The End ***\n\nYou scored 1 out of a possible 1, in 2 turns.\n\n\nWould you like to RESTART"
    )
    assert (
        clean_feedback(raw)
        == "You pick up the coin from the ground. Your score has just gone up by one point."
    )
    assert clean_feedback("\nYou open it.\n\n\n>   ") == "You open it."


# -- with the extra ---------------------------------------------------------------------------------------------
@pytest.mark.textworld
def test_oracle_wins_generated_games(cache_dir):
    env = make(cache_dir, horizon=12)
    tasks = env.make_tasks("train", 2, seed=0)
    assert [t.difficulty for t in tasks] == ["easy", "medium"]
    for task in tasks:
        trace, total, info = play(env, task, lambda e, _obs: e.oracle_action())
        assert info["success"] is True and info["won"] is True
        assert trace[-1][3] is True and trace[-1][4] is False  # terminated, not truncated
        assert total == pytest.approx(1.0)  # normalized score: a won game returns 1
        assert len(trace) - 1 <= task.data["settings"]["quest_length"] + 2
        for entry in trace:
            text, actions = entry[0], entry[1]
            assert actions and list(actions) == sorted(actions) and len(actions) <= MAX_OPTIONS
            assert "# Options" not in text and not any(f"\n{a}\n" in text for a in actions)
        first = trace[0][0]
        assert first.startswith("Goal: ") and "Inventory:" in first and "Location:" in first
        Observation(first, trace[0][1])  # a valid Observation


@pytest.mark.textworld
def test_tasks_deterministic_disjoint_and_games_cached(cache_dir):
    env = make(cache_dir)
    train = env.make_tasks("train", 4, seed=0)
    assert train == env.make_tasks("train", 4, seed=0)
    assert [t.difficulty for t in train] == ["easy", "medium", "hard", "easy"]
    held_out = env.make_tasks("validation", 4, seed=0) + env.make_tasks("test", 4, seed=0)
    assert not {t.seed for t in train} & {t.seed for t in held_out}
    assert {t.difficulty for t in env.make_tasks("train", 3, difficulty="hard")} == {"hard"}
    task = train[0]
    assert task.data == {"challenge": "custom", "settings": SMALL["easy"]}
    (path,) = env.prepare([task])
    start = time.perf_counter()
    assert env.prepare([task]) == [path]  # a cache hit: no generation
    assert time.perf_counter() - start < 0.5
    assert path.startswith(cache_dir) and path.endswith(".z8")


@pytest.mark.textworld
def test_a_generated_game_is_keyed_by_its_content_not_its_task(cache_dir):
    """Two tasks that generate the same game (same settings and seed, other split and id) are one instance; other
    seeds are other games; the key follows the game's description, not its file name."""
    import dataclasses

    from reflect_trl.envs.textworld_games import game_content_key

    env = make(cache_dir)
    train = env.make_tasks("train", 2, seed=0, difficulty="easy")
    twin = dataclasses.replace(train[0], task_id="textworld-custom-test-easy-99")
    keys = [env.instance_key(t) for t in train]
    assert env.instance_key(twin) == keys[0] != keys[1] and keys[0].startswith("textworld-easy-")
    (path,) = env.prepare([train[0]])
    description = json.loads(Path(path).with_suffix(".json").read_text())
    copy = Path(cache_dir) / "content-key-copy.json"
    copy.write_text(json.dumps({**description, "metadata": {"seed": "another"}}))
    assert game_content_key(copy) == game_content_key(path)
    description["quests"][0]["commands"] = ["look"]
    copy.write_text(json.dumps(description))
    assert game_content_key(copy) != game_content_key(path)
    with pytest.raises(ValueError, match="cannot read the game description .*missing.json"):
        game_content_key(Path(cache_dir) / "missing.z8")


@pytest.mark.textworld
def test_seeded_random_policy_is_reproducible(cache_dir):
    task = make(cache_dir).make_tasks("train", 1, seed=0)[0]

    def episode():
        rng = random.Random(7)
        env = make(cache_dir, horizon=8)
        trace, total, _ = play(env, task, lambda _e, obs: rng.randrange(len(obs.actions)))
        env.close()
        return trace, total

    first, second = episode(), episode()
    assert first == second
    assert len(first[0]) > 1


@pytest.mark.textworld
def test_clone_replays_and_tests_a_candidate_action(cache_dir):
    env = make(cache_dir, horizon=12)
    task = env.make_tasks("train", 2, seed=0)[1]  # medium: two commands to win
    env.reset(task=task)
    rng = random.Random(0)
    detour = next(i for i in range(len(env.observation.actions)) if i != env.oracle_action())
    env.step(detour)  # a command off the plan, then back to the plan
    while env.remaining_plan_length() > 1:
        env.step(env.oracle_action())
    before = (env.observation, env.t, list(env.commands), env.score)

    twin = env.clone()
    assert (twin.observation, twin.t, twin.commands, twin.score) == before
    assert twin.oracle_action() == env.oracle_action()
    _, reward, terminated, truncated, info = twin.step(env.oracle_action())
    assert terminated and not truncated and info["success"] and reward > 0  # the candidate ends the episode
    assert (env.observation, env.t, list(env.commands), env.score) == before  # the original is untouched
    assert not env.done

    other = env.clone()
    other.step(rng.choice([i for i in range(len(other.observation.actions)) if i != other.oracle_action()]))
    assert not other.done or not other.won
    env.close(), twin.close(), other.close()


@pytest.mark.textworld
def test_reset_by_seed_and_horizon_truncation(cache_dir):
    env = make(cache_dir, horizon=2, stage="easy", exclude_commands=["examine"])
    seed = env.make_tasks("train", 1, seed=0)[0].seed  # the same game as that task (already cached)
    obs = env.reset(seed=seed)
    assert env.task is not None and env.task.difficulty == "easy" and env.task.seed == seed
    assert not any(a.startswith("examine ") for a in obs.actions)
    look = obs.actions.index("look")
    env.step(look)
    _, reward, terminated, truncated, info = env.step(env.observation.actions.index("look"))
    assert truncated and not terminated and info["success"] is False and reward == 0
    with pytest.raises(RuntimeError, match="finished episode"):
        env.step(0)


@pytest.mark.slow
@pytest.mark.textworld
@pytest.mark.parametrize("challenge", ["tw-coin_collector", "tw-treasure_hunter", "tw-simple", "tw-cooking"])
def test_challenge_games_are_won_by_the_oracle(cache_dir, challenge):
    from reflect_trl.envs import make_env
    from reflect_trl.envs.textworld_env import DEFAULT_STAGE_SETTINGS

    env = make_env("textworld", challenge=challenge, cache_dir=cache_dir, horizon=30)
    task = env.make_tasks("test", 1, seed=0, difficulty="easy")[0]
    assert task.data == {"challenge": challenge, "settings": DEFAULT_STAGE_SETTINGS[challenge]["easy"]}
    _, total, info = play(env, task, lambda e, _obs: e.oracle_action())
    assert info["success"] and total == pytest.approx(1.0)


# -- your own game files ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def made_game(tmp_path_factory) -> Path:
    """A game made by ``tw-make`` as a user would bring it: 2 rooms, 4 objects, a 2-command quest (seed 3: a type K
    keycard on the bedroom floor, a teaspoon carried, a room to the west; take the keycard, unlock the chest)."""
    pytest.importorskip("textworld")
    folder = tmp_path_factory.mktemp("tw-make")
    tw_make = shutil.which("tw-make", path=str(Path(sys.executable).parent)) or shutil.which("tw-make")
    assert tw_make, "tw-make (installed with textworld) not found"
    command = [
        tw_make,
        "custom",
        "--world-size",
        "2",
        "--nb-objects",
        "4",
        "--quest-length",
        "2",
        "--seed",
        "3",
    ]
    out = subprocess.run(
        [*command, "--output", str(folder / "made.z8"), "-f", "--silent"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert (folder / "made.z8").is_file() and (folder / "made.json").is_file()
    return folder / "made.z8"


def copy_game(game: Path, dest: Path, metadata: dict | None = None) -> Path:
    """Copy a game and its .json to ``dest`` (a .z8 or .ulx path); ``metadata`` replaces the .json's content."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(game, dest)
    if metadata is None:
        shutil.copy(game.with_suffix(".json"), dest.with_suffix(".json"))
    else:
        dest.with_suffix(".json").write_text(json.dumps(metadata))
    return dest


def file_env(tmp_path: Path, **kwargs):
    from reflect_trl.envs import make_env

    kwargs.setdefault("cache_dir", str(tmp_path / "cache"))
    return make_env("textworld", horizon=12, **kwargs)


def walk(env, task, commands: list[str], seed: int | None = None):
    """Reset, run ``commands`` (by text), return the state key."""
    env.reset(task=task, seed=seed)
    for command in commands:
        assert command in env.observation.actions, (command, env.observation.actions)
        env.step(env.observation.actions.index(command))
    return env.state_key()


@pytest.mark.textworld
def test_game_files_by_path_play_with_the_oracle(made_game, tmp_path):
    env = file_env(tmp_path, game_files=[str(made_game)], game_split="all")
    tasks = env.make_tasks("test", 3, seed=0)
    assert [t.data for t in tasks] == [{"game_file": str(made_game.resolve())}] * 3
    assert {env.instance_key(t) for t in tasks} == {str(made_game.resolve())}, "one game file, one instance"
    assert len({t.seed for t in tasks}) == 3 and {t.difficulty for t in tasks} == {
        "easy"
    }  # a 2-command walkthrough
    assert tasks == file_env(tmp_path, game_files=[str(made_game)], game_split="all").make_tasks(
        "test", 3, seed=0
    )
    trace, total, info = play(env, tasks[0], lambda e, _obs: e.oracle_action())
    assert info["success"] and total == pytest.approx(1.0) and len(trace) == 3
    assert env.commands == ["take type K keycard", "unlock type K chest with type K keycard"]
    assert env.game_file == str(made_game.resolve())
    assert (
        file_env(tmp_path, game_files=[str(made_game)], game_split="all", stage_lengths=[1, 2])
        .make_tasks("train", 1)[0]
        .difficulty
        == "medium"
    )
    with pytest.raises(ValueError, match="no 'train' game of stage 'hard'.*game_split: all"):
        env.make_tasks("train", 1, difficulty="hard")
    env.close()


@pytest.mark.textworld
def test_game_dir_splits_by_folder_else_by_file_name_hash(made_game, tmp_path):
    for folder, name in (("train", "a"), ("valid", "b"), ("test", "c")):
        copy_game(made_game, tmp_path / "ftwp" / "games" / folder / f"{name}.z8")
    env = file_env(tmp_path, game_dir=str(tmp_path / "ftwp"))
    assert {t.data["game_file"] for t in env.make_tasks("train", 3)} == {"games/train/a.z8"}
    assert {t.data["game_file"] for t in env.make_tasks("validation", 3)} == {"games/valid/b.z8"}
    assert {t.data["game_file"] for t in env.make_tasks("test", 3)} == {"games/test/c.z8"}

    flat = tmp_path / "flat"
    names = [f"game{i:02d}" for i in range(20)]
    for name in names:
        copy_game(made_game, flat / f"{name}.z8")

    def splits(folder: Path, **kwargs) -> dict[str, set[str]]:
        env = file_env(tmp_path, game_dir=str(folder), **kwargs)
        return {
            s: {t.data["game_file"] for t in env.make_tasks(s, 40)} for s in ("train", "validation", "test")
        }

    by_hash = splits(flat)
    assert all(by_hash.values()) and set.union(*by_hash.values()) == {f"{n}.z8" for n in names}
    assert sum(map(len, by_hash.values())) == len(names)  # disjoint
    assert len(by_hash["train"]) > len(by_hash["test"])
    flat.rename(tmp_path / "moved")
    assert splits(tmp_path / "moved") == by_hash  # the file name decides, not the folder
    assert all(v == {f"{n}.z8" for n in names} for v in splits(tmp_path / "moved", game_split="all").values())


@pytest.mark.textworld
def test_game_without_a_quest_plays_but_the_oracle_names_the_file(made_game, tmp_path):
    metadata = json.loads(made_game.with_suffix(".json").read_text())
    metadata["quests"] = []
    metadata["metadata"].pop("walkthrough")
    game = copy_game(made_game, tmp_path / "no-quest" / "bare.z8", metadata)
    env = file_env(tmp_path, game_files=[str(game)], game_split="all")
    task = env.make_tasks("train", 1)[0]
    assert task.difficulty == "hard"  # unknown walkthrough length
    obs = env.reset(task=task)
    env.step(obs.actions.index("take type K keycard"))  # playing needs no walkthrough
    env.reset(task=task)
    with pytest.raises(RuntimeError, match=f"{game}.*no walkthrough"):
        env.oracle_action()
    env.close()


@pytest.mark.textworld
def test_ulx_game_is_played_through_a_z8_compiled_from_its_json(made_game, tmp_path):
    ulx = tmp_path / "glulx" / "cooking.ulx"
    ulx.parent.mkdir()
    ulx.write_bytes(b"Glul")  # TextWorld 1.7 cannot run Glulx: only the .json is used
    shutil.copy(made_game.with_suffix(".json"), ulx.with_suffix(".json"))
    env = file_env(tmp_path, game_files=[str(ulx)], game_split="all")
    task = env.make_tasks("train", 1)[0]
    assert task.data["game_file"] == str(ulx.resolve())
    _, total, info = play(env, task, lambda e, _obs: e.oracle_action())
    assert info["success"] and total == pytest.approx(1.0)
    compiled = Path(env.game_file)
    assert compiled.suffix == ".z8" and compiled.parent == tmp_path / "cache" / "compiled"
    stamp = compiled.stat().st_mtime_ns
    again = file_env(tmp_path, game_files=[str(ulx)], game_split="all")
    again.reset(task=task)
    assert again.game_file == str(compiled) and compiled.stat().st_mtime_ns == stamp  # compiled once
    env.close(), again.close()


@pytest.mark.textworld
def test_game_file_errors_name_the_file_and_the_fix(made_game, tmp_path):
    from reflect_trl.envs.base import Task

    missing = tmp_path / "missing.z8"
    with pytest.raises(FileNotFoundError, match=f"game_files: game file {missing} does not exist"):
        file_env(tmp_path, game_files=[str(missing)])
    lonely = tmp_path / "lonely" / "game.z8"
    lonely.parent.mkdir()
    shutil.copy(made_game, lonely)
    with pytest.raises(FileNotFoundError, match=f"{lonely} has no game.json next to it"):
        file_env(tmp_path, game_files=[str(lonely)])
    with pytest.raises(FileNotFoundError, match=f"game_dir {lonely.parent}: .*no game.json"):
        file_env(tmp_path, game_dir=str(lonely.parent)).make_tasks("train", 1)
    text = tmp_path / "notes.txt"
    text.write_text("not a game")
    with pytest.raises(ValueError, match=f"{text} is not a TextWorld game"):
        file_env(tmp_path, game_files=[str(text)])
    with pytest.raises(FileNotFoundError, match="game_dir .*nowhere is not a directory"):
        file_env(tmp_path, game_dir=str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no .z8 or .ulx game"):
        file_env(tmp_path, game_dir=str(tmp_path / "empty")).make_tasks("train", 1)
    with pytest.raises(ValueError, match="settings apply to generated games"):
        file_env(tmp_path, game_files=[str(made_game)], settings={"easy": {"world_size": 2}})
    with pytest.raises(ValueError, match="game_split must be one of"):
        file_env(tmp_path, game_files=[str(made_game)], game_split="random")
    with pytest.raises(ValueError, match="stage_lengths must be"):
        file_env(tmp_path, game_files=[str(made_game)], stage_lengths=[5])
    relative = Task("textworld", "t", "easy", 0, {"game_file": "games/train/a.z8"})
    with pytest.raises(ValueError, match="relative to a game_dir; set game_dir"):
        file_env(tmp_path, game_files=[str(made_game)]).reset(task=relative)


@pytest.mark.textworld
def test_engine_versions_and_card(made_game, tmp_path):
    import textworld

    from reflect_trl.envs.textworld_env import TextWorldEnv

    assert TextWorldEnv.engine_versions() == {"textworld": textworld.__version__}
    card = file_env(tmp_path, game_files=[str(made_game)]).card()
    assert json.loads(json.dumps(card)) == card
    assert card["versions"]["textworld"] == textworld.__version__
    assert card["settings"]["game_files"] == [str(made_game)]


# -- state key (gigpo step groups) ------------------------------------------------------------------------------
@pytest.mark.textworld
def test_state_key_merges_routes_and_separates_world_states(made_game, tmp_path):
    env = file_env(tmp_path, game_files=[str(made_game)], game_split="all")
    task = env.make_tasks("train", 1)[0]
    start = walk(env, task, [])
    hash(start)
    assert walk(env, task, ["take type K keycard", "drop type K keycard"]) == start
    assert "Last result: You drop the type K keycard" in env.observation.text  # the last result is not state
    assert walk(env, task, ["go west", "go east"]) == start
    assert walk(env, task, ["look"], seed=77) == start  # the episode seed only varies wording

    held = walk(env, task, ["take type K keycard"])
    assert held != start  # the keycard in the inventory, not on the floor
    facts = sorted(map(str, env.state["_facts"]))
    # The same facts, but the game now lists the inventory in another order, in every later observation.
    assert walk(env, task, ["drop teaspoon", "take type K keycard", "take teaspoon"]) != held
    assert sorted(map(str, env.state["_facts"])) == facts
    assert walk(env, task, ["take type K keycard", "go west", "go east"]) == held
    won = walk(env, task, ["take type K keycard", "unlock type K chest with type K keycard"])
    assert won not in (start, held)


@pytest.mark.textworld
def test_state_key_is_stable_across_clones_and_instances(made_game, tmp_path):
    env = file_env(tmp_path, game_files=[str(made_game)], game_split="all")
    task = env.make_tasks("train", 1)[0]
    key = walk(env, task, ["drop teaspoon", "go west"])
    assert env.clone().state_key() == key
    other = file_env(tmp_path, game_files=[str(made_game)], game_split="all")
    assert walk(other, task, ["drop teaspoon", "go west"]) == key
    assert walk(other, task, ["go west", "go east", "drop teaspoon", "go west"], seed=5) == key
    env.close(), other.close()
    with pytest.raises(RuntimeError, match="before reset"):
        file_env(tmp_path, game_files=[str(made_game)]).state_key()


@pytest.mark.textworld
def test_episode_seed_does_not_change_the_generated_game(cache_dir):
    env = make(cache_dir, horizon=6)
    task = env.make_tasks("train", 1, seed=0)[0]
    obs = env.reset(task=task)
    game, key = env.game_file, env.state_key()
    again = env.reset(task=task, seed=task.seed + 1)  # an RL or eval episode seed
    assert env.game_file == game and again == obs and env.state_key() == key and env.task == task
    env.close()
