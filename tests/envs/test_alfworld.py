"""ALFWorldEnv on a hand-written scene (no ALFWorld download), and its fail-fast data checks.

The scene (``data/alfworld_tomato_microwave``: a PDDL problem + ``traj_data.json``, written from scratch for
these tests) is turned into ``game.tw-pddl`` the way ALFWorld builds its games: the ALFRED domain, the grammar
with the task text filled in, the problem, ``solvable: true``.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from reflect_trl.envs.alfworld_env import ALFWorldDataError, ALFWorldEnv
from reflect_trl.envs.textgame import seeded_global_random

SCENE = Path(__file__).parent / "data" / "alfworld_tomato_microwave"
TASK_DIR = "pick_and_place_simple-Tomato-None-Microwave-7"
TRIAL = "trial_T20000101_000000_000001"


def write_scene(data_dir: Path, split: str = "train") -> Path:
    """Write the hand-written scene as an ALFWorld game under ``data_dir``; returns the game file."""
    import alfworld
    from alfworld.agents.utils.misc import add_task_to_grammar

    builtin = Path(alfworld.__file__).parent / "data"
    traj = json.loads((SCENE / "traj_data.json").read_text())
    trial = data_dir / "json_2.1.1" / split / TASK_DIR / TRIAL
    trial.mkdir(parents=True, exist_ok=True)
    (trial / "traj_data.json").write_text(json.dumps(traj))
    problem = (SCENE / "problem.pddl").read_text()
    (trial / "initial_state.pddl").write_text(problem)
    with seeded_global_random(0):  # ALFWorld picks the goal's wording with the global `random`
        grammar = add_task_to_grammar((builtin / "alfred.twl2").read_text(), traj)
    game = {
        "pddl_domain": (builtin / "alfred.pddl").read_text(),
        "grammar": grammar,
        "pddl_problem": problem,
        "solvable": True,
    }
    (trial / "game.tw-pddl").write_text(json.dumps(game))
    return trial / "game.tw-pddl"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("alfworld-data")
    saved = os.environ.get("ALFWORLD_DATA")
    os.environ["ALFWORLD_DATA"] = str(
        root
    )  # importing alfworld creates $ALFWORLD_DATA (default ~/.cache/alfworld)
    try:
        pytest.importorskip("alfworld")
        write_scene(root, "train")
        write_scene(root, "valid_seen")
        yield root
    finally:
        if saved is None:
            os.environ.pop("ALFWORLD_DATA", None)
        else:
            os.environ["ALFWORLD_DATA"] = saved


# -- no extra needed -------------------------------------------------------------------------------------------
_MISSING_DATA_SCRIPT = """
import os, sys, time
os.environ["ALFWORLD_DATA"] = sys.argv[1]
start = time.perf_counter()
from reflect_trl.envs import make_env
try:
    make_env("alfworld")
except FileNotFoundError as err:
    print(f"{time.perf_counter() - start:.3f}")
    print(type(err).__name__, err)
"""


def test_missing_data_fails_at_once_with_instructions(tmp_path):
    missing = tmp_path / "no-alfworld-here"
    # A subprocess with a hard timeout: the test itself can never hang, whatever the code under test does.
    out = subprocess.run(
        [sys.executable, "-c", _MISSING_DATA_SCRIPT, str(missing)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    elapsed, message = out.stdout.split("\n", 1)
    assert float(elapsed) < 1.0
    assert message.startswith("ALFWorldDataError")
    assert str(missing) in message and "$ALFWORLD_DATA" in message
    assert "pip install 'reflect-trl[alfworld]'" in message and "alfworld-download" in message
    assert "export ALFWORLD_DATA=" in message


@pytest.mark.timeout(30)
def test_no_matching_games_fails_before_any_engine(tmp_path, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))  # importing alfworld creates $ALFWORLD_DATA
    pytest.importorskip("alfworld")
    (tmp_path / "json_2.1.1" / "train").mkdir(parents=True)
    env = ALFWorldEnv(data_dir=str(tmp_path))
    with pytest.raises(ALFWorldDataError, match="no solvable game"):
        env.make_tasks("train", 2)
    with pytest.raises(ALFWorldDataError, match="no solvable game"):
        env.reset(seed=0)  # never reaches the engine, whose reset would spin forever on an empty game list
    assert env._engine is None
    with pytest.raises(ALFWorldDataError):
        env.make_tasks("test", 1)  # valid_unseen does not exist


def test_module_import_is_lazy():
    code = (
        "import sys\nimport reflect_trl.envs.alfworld_env\n"
        "print(sorted(m for m in ('alfworld', 'textworld') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_missing_extra_is_explained(tmp_path):
    (tmp_path / "json_2.1.1").mkdir()
    code = (
        "import sys\nsys.modules['alfworld'] = None  # simulate the extra being absent\n"
        "from reflect_trl.envs.alfworld_env import ALFWorldEnv\n"
        "try:\n    ALFWorldEnv(data_dir=sys.argv[1])\nexcept ImportError as err:\n    print(err)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "pip install 'reflect-trl[alfworld]'" in out.stdout


def test_bad_kwargs_are_named(tmp_path):
    (tmp_path / "json_2.1.1").mkdir()
    with pytest.raises(ValueError, match="unknown task type"):
        ALFWorldEnv(data_dir=str(tmp_path), task_types=["pick_and_juggle"])
    with pytest.raises(ValueError, match="unknown expert"):
        ALFWorldEnv(data_dir=str(tmp_path), expert="psychic")


# -- with the extra ---------------------------------------------------------------------------------------------
def solve(env: ALFWorldEnv, task) -> tuple[list[str], float, dict]:
    obs = env.reset(task=task)
    task_line = obs.text.split("Your task is to: ", 1)[1]
    assert "tomato" in task_line and "microwave" in task_line
    assert "help" not in obs.actions and list(obs.actions) == sorted(obs.actions)
    total, info = 0.0, {}
    while not env.done:
        obs, reward, terminated, truncated, info = env.step(env.oracle_action())
        total += reward
    return list(env.commands), total, info


@pytest.mark.alfworld
@pytest.mark.parametrize("expert", ["handcoded", "planner"])
def test_expert_solves_hand_written_scene_through_the_adapter(data_dir, expert):
    env = ALFWorldEnv(data_dir=str(data_dir), expert=expert, horizon=15)
    tasks = env.make_tasks("train", 2, seed=0)
    assert len(tasks) == 2 and tasks[0].data["game"] == tasks[1].data["game"]  # one game, two runs
    assert tasks[0].seed != tasks[1].seed and tasks[0].difficulty == "easy"
    commands, total, info = solve(env, tasks[0])
    assert info["success"] is True and total == pytest.approx(1.0)
    assert commands[-1] == "move tomato 1 to microwave 1"
    if expert == "planner":
        assert commands == [
            "go to countertop 1",
            "take tomato 1 from countertop 1",
            "go to microwave 1",
            "open microwave 1",
            "move tomato 1 to microwave 1",
        ]
    assert "> take tomato 1 from countertop 1" in env.observation.text
    env.close()


@pytest.mark.alfworld
def test_filters_and_splits(data_dir):
    assert ALFWorldEnv(data_dir=str(data_dir), task_types=None, objects=None, receptacles=None).games("train")
    validation = ALFWorldEnv(data_dir=str(data_dir)).make_tasks("validation", 1)
    assert validation[0].data["game"].startswith("json_2.1.1/valid_seen/")
    repeated = ALFWorldEnv(data_dir=str(data_dir)).make_tasks("validation", 3)
    env = ALFWorldEnv(data_dir=str(data_dir))
    assert len({t.task_id for t in repeated}) == 3  # one game, three tasks ...
    assert {env.instance_key(t) for t in repeated} == {validation[0].data["game"]}  # ... one instance
    with pytest.raises(ALFWorldDataError, match="objects=\\('apple',\\)"):
        ALFWorldEnv(data_dir=str(data_dir), objects=["Apple"]).make_tasks("train", 1)
    with pytest.raises(ALFWorldDataError, match="stage 'hard'"):
        ALFWorldEnv(data_dir=str(data_dir)).make_tasks("train", 1, difficulty="hard")


@pytest.mark.alfworld
def test_clone_replays_expert_state_and_random_policy_is_reproducible(data_dir):
    env = ALFWorldEnv(data_dir=str(data_dir))
    task = env.make_tasks("train", 1, seed=0)[0]

    def random_episode() -> list:
        rng = random.Random(3)
        env.reset(task=task)
        trace = [env.observation]
        for _ in range(4):
            env.step(rng.randrange(len(env.observation.actions)))
            trace.append(env.observation)
        return trace

    assert random_episode() == random_episode()
    twin = env.clone()
    assert twin.observation == env.observation and twin.commands == env.commands
    assert twin.oracle_action() == env.oracle_action()
    snapshot = (env.observation, list(env.commands))
    while not twin.done:
        twin.step(twin.oracle_action())
    assert twin.won or twin.t == twin.horizon
    assert (env.observation, env.commands) == snapshot and not env.done
    env.close(), twin.close()


# -- state key (gigpo step groups) ------------------------------------------------------------------------------
def walk(env: ALFWorldEnv, task, commands: list[str], seed: int | None = None):
    """Reset, run ``commands`` (by text), return the state key."""
    env.reset(task=task, seed=seed)
    for command in commands:
        assert command in env.observation.actions, (command, env.observation.actions)
        env.step(env.observation.actions.index(command))
    return env.state_key()


@pytest.mark.alfworld
def test_state_key_merges_routes_and_separates_world_states(data_dir):
    env = ALFWorldEnv(data_dir=str(data_dir))
    task = env.make_tasks("train", 1, seed=0)[0]
    at_counter = walk(env, task, ["go to countertop 1"])
    hash(at_counter)
    # The engine keeps "not_atlocation(agent, microwave)" after a visit there: history, not state.
    assert walk(env, task, ["go to microwave 1", "go to countertop 1"]) == at_counter
    # "look" sets the inert "checked(countertop)"; the episode seed only varies wording.
    assert (
        walk(env, task, ["go to countertop 1", "look", "go to fridge 1", "go to countertop 1"], seed=9)
        == at_counter
    )
    assert "checked" in {f.name for f in env.state["_facts"]}
    assert walk(env, task, []) != at_counter
    holding = walk(env, task, ["go to countertop 1", "take tomato 1 from countertop 1"])
    assert holding != at_counter  # the tomato in hand, not on the counter
    assert (
        walk(env, task, ["go to countertop 1", "take tomato 1 from countertop 1", "go to microwave 1"])
        != holding
    )
    assert (
        walk(
            env,
            task,
            [
                "go to countertop 1",
                "take tomato 1 from countertop 1",
                "go to microwave 1",
                "go to countertop 1",
            ],
        )
        == holding
    )
    opened = walk(env, task, ["go to microwave 1", "open microwave 1"])
    assert opened != walk(env, task, ["go to microwave 1"])
    assert walk(env, task, ["go to microwave 1", "open microwave 1", "close microwave 1"]) == walk(
        env, task, ["go to microwave 1"]
    )
    assert env.clone().state_key() == env.state_key()
    other = ALFWorldEnv(data_dir=str(data_dir))
    assert walk(other, task, ["go to countertop 1"], seed=1) == at_counter
    env.close(), other.close()


@pytest.mark.alfworld
def test_checked_is_inert_in_the_alfred_domain():
    """``checked`` is left out of the state key because nothing reads it: guard that for the installed ALFWorld."""
    import re

    alfworld = pytest.importorskip("alfworld")  # like every test of the [alfworld] extra
    data = Path(alfworld.__file__).parent / "data"
    domain = (data / "alfred.pddl").read_text()
    domain = re.sub(r";[^\n]*", "", domain)  # comments
    actions = domain.split("(:action")[1:]
    assert actions and any("(checked" in a for a in actions)
    for action in actions:
        assert "(checked" not in action.split(":effect", 1)[0], action.split()[0]  # never a precondition
    assert "checked" not in (data / "alfred.twl2").read_text()  # never in a text
    assert "checked" not in (SCENE / "problem.pddl").read_text()  # nor in the goal


# -- a pinned task panel ----------------------------------------------------------------------------------------
@pytest.mark.alfworld
def test_game_list_pins_the_panel_in_order(data_dir, tmp_path):
    train_game = data_dir / "json_2.1.1" / "train" / TASK_DIR / TRIAL / "game.tw-pddl"
    panel = tmp_path / "panel.txt"
    panel.write_text(
        "# my evaluation panel\n\n"
        f"json_2.1.1/valid_seen/{TASK_DIR}/{TRIAL}\n"  # a trial folder, relative to data_dir
        f"  {train_game}  \n"  # an absolute game file
    )
    env = ALFWorldEnv(data_dir=str(data_dir), game_list=str(panel), objects=["Apple"])  # filters do not apply
    for seed in range(3):  # listed order, whatever the seed
        tasks = env.make_tasks("test", 3, seed=seed)
        assert [t.data["game"] for t in tasks] == [
            f"json_2.1.1/valid_seen/{TASK_DIR}/{TRIAL}/game.tw-pddl",
            f"json_2.1.1/train/{TASK_DIR}/{TRIAL}/game.tw-pddl",
            f"json_2.1.1/valid_seen/{TASK_DIR}/{TRIAL}/game.tw-pddl",
        ]
    commands, total, info = solve(env, tasks[0])
    assert info["success"] and total == pytest.approx(1.0)
    env.close()
    # Only for the test split: train is scanned (and filtered) as usual; valid_unseen need not exist.
    per_split = ALFWorldEnv(data_dir=str(data_dir), game_list={"test": str(panel)})
    assert len(per_split.make_tasks("test", 2)) == 2 and per_split.make_tasks("train", 1)
    assert per_split.card()["settings"]["game_list"] == {"test": str(panel)}


@pytest.mark.alfworld
def test_game_list_errors_name_the_file_and_line(data_dir, tmp_path):
    panel = tmp_path / "panel.txt"
    panel.write_text(f"# header\njson_2.1.1/train/{TASK_DIR}/{TRIAL}\njson_2.1.1/train/nothing/here\n")
    with pytest.raises(
        ALFWorldDataError, match=f"game_list {panel}, line 3: 'json_2.1.1/train/nothing/here'"
    ):
        ALFWorldEnv(data_dir=str(data_dir), game_list=str(panel)).make_tasks("test", 1)
    with pytest.raises(
        FileNotFoundError, match="game_list for split 'test': file .*absent.txt does not exist"
    ):
        ALFWorldEnv(data_dir=str(data_dir), game_list={"test": str(tmp_path / "absent.txt")})
    with pytest.raises(ValueError, match="game_list names unknown split"):
        ALFWorldEnv(data_dir=str(data_dir), game_list={"dev": str(panel)})
    panel.write_text("# nothing but comments\n\n")
    with pytest.raises(ALFWorldDataError, match="lists no game"):
        ALFWorldEnv(data_dir=str(data_dir), game_list=str(panel)).make_tasks("train", 1)


@pytest.mark.alfworld
def test_game_list_needs_no_data_dir_when_it_covers_every_split(data_dir, tmp_path):
    panel = tmp_path / "panel.txt"
    panel.write_text(f"{data_dir / 'json_2.1.1' / 'train' / TASK_DIR / TRIAL / 'game.tw-pddl'}\n")
    env = ALFWorldEnv(data_dir=str(tmp_path / "no-data-here"), game_list=str(panel))
    (task,) = env.make_tasks("validation", 1)
    assert Path(task.data["game"]).is_absolute()
    env.reset(task=task)
    env.close()


def test_engine_versions_are_reported():
    from importlib.metadata import PackageNotFoundError, version

    versions = ALFWorldEnv.engine_versions()
    assert set(versions) == {"alfworld", "textworld"}
    for name, value in versions.items():
        try:
            assert value == version(name)
        except PackageNotFoundError:  # without the [alfworld] extra: recorded as missing
            assert value is None
