"""examples/lock_puzzle: the environment's contract (tasks, oracle, state_key) and its oracle reflector."""

from __future__ import annotations

import random

import pytest
from reflect_lock_puzzle.env import (
    ACTIONS,
    DOWN,
    NEXT,
    OPEN,
    STAGES,
    UP,
    LockPuzzleEnv,
    distance,
    split_of,
)
from reflect_lock_puzzle.reflector import LockPuzzleOracleReflector

from reflect_trl.envs import SPLITS, Task
from reflect_trl.reflection import ReflectionContext


def task(start, code, stage="three_dials") -> Task:
    return Task("lock_puzzle", "t", stage, 0, {"start": list(start), "code": list(code)})


def play(env: LockPuzzleEnv, actions) -> None:
    for action in actions:
        env.step(action)


@pytest.mark.parametrize("split", SPLITS)
def test_oracle_solves_every_task_within_the_horizon(split):
    env = LockPuzzleEnv()
    for stage in STAGES:
        tasks = env.make_tasks(split, 60, seed=3, difficulty=stage)
        for t in tasks:
            env.reset(task=t)
            steps, info = 0, {}
            while not env.done:
                _, _, _, _, info = env.step(env.oracle_action())
                steps += 1
            assert info["success"] is True and not info["crash"], t
            assert steps == t.data["shortest_steps"] <= env.horizon, t
        wrong = {sum(s != c for s, c in zip(t.data["start"], t.data["code"], strict=True)) for t in tasks}
        assert wrong == {STAGES.index(stage) + 1}


def test_tasks_are_seeded_and_splits_never_share_a_puzzle():
    env = LockPuzzleEnv()
    assert env.make_tasks("train", 30, seed=5) == LockPuzzleEnv().make_tasks("train", 30, seed=5)
    assert env.make_tasks("train", 30, seed=5) != env.make_tasks("train", 30, seed=6)
    assert [t.difficulty for t in env.make_tasks("test", 6)] == [*STAGES, *STAGES]
    puzzles = {
        split: {(tuple(t.data["start"]), tuple(t.data["code"])) for t in env.make_tasks(split, 300, seed=0)}
        for split in SPLITS
    }
    assert all(split_of(*p) == split for split, ps in puzzles.items() for p in ps)
    assert not puzzles["train"] & puzzles["test"] and not puzzles["train"] & puzzles["validation"]
    with pytest.raises(ValueError, match="unknown difficulty"):
        env.make_tasks("train", 1, difficulty="four_dials")
    with pytest.raises(ValueError, match="unknown split"):
        env.make_tasks("dev", 1)


def test_rules_success_jam_stuck_and_horizon():
    env = LockPuzzleEnv(horizon=4)
    env.reset(task=task((1, 2, 4), (1, 2, 3)))
    play(env, [NEXT, NEXT])
    _, reward, terminated, _, info = env.step(UP)  # dial 3 is at 4 already: it does not move
    assert info["stuck"] and env.dials == (1, 2, 4) and not terminated and reward == 0.0
    assert "Last move: dial 3 could not go up from 4." in env.observation.text
    _, reward, terminated, _, info = env.step(OPEN)
    assert terminated and info["crash"] and not info["success"] and reward == 0.0  # jammed
    env.reset(task=task((1, 2, 4), (1, 2, 3)))
    play(env, [NEXT, NEXT, DOWN])
    assert env.dials == (1, 2, 3) and env.oracle_action() == OPEN
    assert "Selected: dial 3, showing 3, code digit 3.\nRight dials: 3 of 3." in env.observation.text
    _, reward, terminated, _, info = env.step(OPEN)
    assert terminated and info["success"] and reward == 1.0
    env.reset(task=task((0, 0, 0), (2, 2, 2)))
    for _ in range(4):
        _, _, terminated, truncated, info = env.step(NEXT)
    assert truncated and not terminated and info["success"] is False and env.done


def test_oracle_turns_the_selected_dial_then_moves_on_then_opens():
    env = LockPuzzleEnv()
    env.reset(task=task((1, 4, 0), (1, 2, 3)))
    assert ACTIONS[env.oracle_action()] == "select the next dial"
    env.step(NEXT)
    assert ACTIONS[env.oracle_action()] == "turn the dial down"
    env.reset(task=task((0, 2, 3), (1, 2, 3)))
    assert ACTIONS[env.oracle_action()] == "turn the dial up"
    env.step(UP)
    assert ACTIONS[env.oracle_action()] == "open the lock"


def test_state_key_is_the_markov_state():
    env = LockPuzzleEnv()
    puzzle = task((1, 1, 1), (2, 2, 2))
    env.reset(task=puzzle)
    start = env.state_key()
    play(env, [UP, NEXT])
    one_route = env.state_key()
    env.reset(task=puzzle)
    play(env, [NEXT, NEXT, NEXT, DOWN, UP, UP, NEXT])  # around the lock once, dial 1 down and up twice
    other_route = env.state_key()
    assert one_route == other_route and hash(one_route) == hash(other_route)  # no history, no step count
    assert env.observation.text != LockPuzzleEnv().reset(task=puzzle).text
    assert one_route != start
    env.step(UP)
    assert env.state_key() != other_route
    env.reset(task=task((2, 1, 1), (2, 2, 2)))  # same dials as one_route, but dial 1 selected
    assert env.state_key() != one_route
    env.reset(task=task((2, 1, 1), (2, 2, 1)))
    env.step(NEXT)  # same dials and selection, other code
    assert env.state_key() != one_route


def test_equal_keys_face_the_same_future():
    """The contract of state_key: from equal keys, every action sequence gives the same rewards and options."""
    rng = random.Random(0)
    env = LockPuzzleEnv()
    for t in env.make_tasks("train", 30, seed=1):
        a, b = LockPuzzleEnv(), LockPuzzleEnv()
        a.reset(task=t), b.reset(task=t)
        play(a, [NEXT, NEXT, NEXT])
        assert a.state_key() == b.state_key()
        for action in [rng.randrange(len(ACTIONS)) for _ in range(6)]:
            ra, rb = a.step(action), b.step(action)
            assert ra[1:4] == rb[1:4] and ra[0].actions == rb[0].actions
            assert a.state_key() == b.state_key()
            if a.done or b.done:
                break


def ctx(env: LockPuzzleEnv, last_action: int | None) -> ReflectionContext:
    last = None if last_action is None else ACTIONS[last_action]
    return ReflectionContext(env, env.observation, env.t, env.oracle_action(), None, last)


def test_reflection_names_the_oracle_action_by_its_text():
    env, reflector = LockPuzzleEnv(), LockPuzzleOracleReflector()
    for seed, t in enumerate(env.make_tasks("validation", 30)):
        rng = random.Random(seed)
        env.reset(task=t)
        last = None
        while not env.done:
            oracle = env.oracle_action()
            text = reflector.reflect(ctx(env, last), rng)
            assert [a for a in ACTIONS if a in text] == [ACTIONS[oracle]], text  # names it, and no other
            env.step(oracle)
            last = oracle


@pytest.mark.parametrize(
    ("start", "mistakes", "words"),
    [
        ((1, 2, 0), [UP], "already matched"),  # dial 1 was right; either wording says so
        ((0, 2, 0), [DOWN], "cannot go down"),  # dial 1 is at 0: a wasted step
        ((1, 3, 0), [NEXT, UP], "away from"),  # dial 2 should go down
        ((0, 2, 0), [NEXT], "did not match"),  # left dial 1 before it matched
    ],
)
def test_reflection_names_the_mistake_and_the_recovery(start, mistakes, words):
    env, reflector = LockPuzzleEnv(), LockPuzzleOracleReflector()
    env.reset(task=task(start, (1, 2, 3)))
    before = (distance(env.dials, env.code), env.selected)
    play(env, mistakes)
    texts = {reflector.reflect(ctx(env, mistakes[-1]), random.Random(seed)) for seed in range(30)}
    assert len(texts) > 1  # several wordings
    recovery = ACTIONS[env.oracle_action()]
    assert (distance(env.dials, env.code), env.selected) != before or recovery != ACTIONS[mistakes[-1]]
    for text in texts:
        review, plan = text.split(". ", 1)
        assert "mistake" in review or "did nothing" in review, text
        assert recovery in plan and recovery not in review, text  # the recovery, by its exact action text
    assert any(words in text for text in texts), texts


def test_reflection_after_a_jam_and_after_opening():
    env, reflector = LockPuzzleEnv(), LockPuzzleOracleReflector()
    env.reset(task=task((1, 2, 0), (1, 2, 3)))
    env.step(OPEN)
    text = reflector.reflect(ctx(env, OPEN), random.Random(0))
    assert "mistake" in text and "2 of 3" in text and "jammed" in text
    assert not any(a in text for a in ACTIONS)  # the episode is over: no plan
    env.reset(task=task((1, 2, 3), (1, 2, 3)))
    env.step(OPEN)
    assert "mistake" not in reflector.reflect(ctx(env, OPEN), random.Random(0))


def test_reflector_is_seeded_and_checks_its_context():
    env, reflector = LockPuzzleEnv(), LockPuzzleOracleReflector()
    env.reset(task=task((0, 2, 0), (1, 2, 3)))
    assert len({reflector.reflect(ctx(env, None), random.Random(7)) for _ in range(3)}) == 1
    with pytest.raises(ValueError, match="no step"):
        reflector.reflect(ctx(env, OPEN), random.Random(0))
    env.step(UP)
    with pytest.raises(ValueError, match="last action was 'turn the dial up'"):
        reflector.reflect(ctx(env, DOWN), random.Random(0))
