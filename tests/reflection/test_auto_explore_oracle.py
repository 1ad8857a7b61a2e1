"""The AutoExplore oracle reflector: short, seeded, names the last command's effect and the next command."""

from __future__ import annotations

import random
import re

import pytest

from reflect_trl.envs.auto_explore import AutoExploreEnv
from reflect_trl.envs.auto_explore.example_repo import write_example_repo
from reflect_trl.envs.base import SPLITS
from reflect_trl.reflection import ReflectionContext, get_oracle_reflector
from reflect_trl.reflection.auto_explore_oracle import AutoExploreOracleReflector

FORBIDDEN = re.compile(r"oracle|optimal|spoiler", re.IGNORECASE)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return AutoExploreEnv(roots=[str(write_example_repo(tmp_path_factory.mktemp("repos")))])


def task_for(env, target):
    return next(t for s in SPLITS for t in env.task_pool(s) if t.data["targets"] == [target])


def context(env, obs, step, previous=None, last=None, was_oracle=None):
    return ReflectionContext(env, obs, step, env.oracle_action(), previous, last, was_oracle)


def check(text: str, next_command: str) -> None:
    assert f"`{next_command}`" in text, text
    assert len(text.split()) < 60, text
    assert not FORBIDDEN.search(text), text


def test_registry_builds_it_without_arguments():
    assert isinstance(get_oracle_reflector("auto_explore"), AutoExploreOracleReflector)


def test_reflections_along_a_successful_episode(env):
    reflector = AutoExploreOracleReflector()
    rng = random.Random(0)
    obs = env.reset(task=task_for(env, "coffee/storage/db/schema.py"))
    previous, last = None, None
    texts = []
    for step in range(env.horizon):
        ctx = context(env, obs, step, previous, last, None if last is None else True)
        text = reflector.reflect(ctx, rng)
        check(text, ctx.oracle_action_text)
        texts.append(text)
        previous, last = obs, ctx.oracle_action_text
        obs, _, terminated, truncated, _ = env.step(ctx.oracle_action)
        if terminated or truncated:
            break
    assert len(texts) == 5  # cd coffee, cd storage, cd db, cat schema.py, id schema.py
    assert "mistake" not in " ".join(texts) and "led away" not in " ".join(texts)
    assert env.topic in texts[0]


def test_wrong_file_is_named_as_a_mistake(env):
    reflector = AutoExploreOracleReflector()
    obs = env.reset(task=task_for(env, "coffee/payments/card.py"))
    obs, *_ = env.step(obs.actions.index("cd coffee"))
    previous = obs
    obs, *_ = env.step(obs.actions.index("cat menu.py"))  # wrong file
    text = reflector.reflect(context(env, obs, 2, previous, "cat menu.py", False), random.Random(1))
    check(text, "cd payments")
    assert "menu.py" in text and ("mistake" in text or "not the file" in text)


def test_wrong_directory_names_the_way_back(env):
    reflector = AutoExploreOracleReflector()
    obs = env.reset(task=task_for(env, "coffee/payments/card.py"))
    previous = obs
    obs, *_ = env.step(obs.actions.index("cd docs"))  # wrong directory
    for seed in range(6):
        text = reflector.reflect(context(env, obs, 1, previous, "cd docs", False), random.Random(seed))
        check(text, "cd ..")
        assert "docs/" in text and ("led away" in text or "mistake" in text)
    previous = obs
    obs, *_ = env.step(obs.actions.index("cd .."))  # coming back helped
    text = reflector.reflect(context(env, obs, 2, previous, "cd ..", True), random.Random(0))
    check(text, "cd coffee")
    assert "mistake" not in text


def test_seeded_and_varied(env):
    reflector = AutoExploreOracleReflector()
    obs = env.reset(task=task_for(env, "coffee/payments/card.py"))
    ctx = context(env, obs, 0)
    assert reflector.reflect(ctx, random.Random(3)) == reflector.reflect(ctx, random.Random(3))
    assert len({reflector.reflect(ctx, random.Random(s)) for s in range(20)}) >= 3


def test_default_corpus_reflections_stay_short(tmp_path):
    env = AutoExploreEnv()
    reflector = AutoExploreOracleReflector()
    rng = random.Random(0)
    for task in env.make_tasks("train", 30, seed=0):
        obs = env.reset(task=task)
        previous, last = None, None
        for step in range(env.horizon):
            oracle = env.oracle_action()
            action = (
                oracle
                if rng.random() < 0.6 or obs.actions[oracle].startswith("id")
                else rng.randrange(len(obs.actions))
            )
            if obs.actions[action].startswith("id") and action != oracle:
                action = oracle
            ctx = context(env, obs, step, previous, last)
            check(reflector.reflect(ctx, rng), obs.actions[oracle])
            previous, last = obs, obs.actions[action]
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
