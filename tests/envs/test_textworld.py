"""TextWorldEnv: locally generated games, played through the TextEnv interface (needs the [textworld] extra,
except the checks of the lazy import and of the option selection)."""

from __future__ import annotations

import random
import subprocess
import sys
import time

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


def test_select_options_sorts_excludes_and_caps_keeping_the_plan_command():
    commands = [f"take item {i:02d}" for i in range(80)] + ["examine box", "look", "go east", "help"]
    options = select_options(commands, keep=["take item 79"], exclude=["help"], cap=MAX_OPTIONS)
    assert len(options) == MAX_OPTIONS == len(DEFAULT_LABELS)
    assert list(options) == sorted(options)
    assert "take item 79" in options and "help" not in options
    assert "look" not in options and "examine box" not in options  # low-value commands are pruned first
    assert select_options(["b", "a", "a"], keep=[], exclude=[], cap=5) == ("a", "b")
    assert select_options(
        ["look", "examine x", "examine y"], keep=["examine x"], exclude=["examine"], cap=5
    ) == (
        "examine x",
        "look",
    )


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
