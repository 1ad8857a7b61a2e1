"""TaxiOracleReflector: seeded, varied, names mistakes and the recovery action, never leaks the word oracle."""

from __future__ import annotations

import random
import re

import pytest

from reflect_trl.envs.taxi import (
    ACTIONS,
    DROPOFF,
    EAST,
    PICKUP,
    SOUTH,
    DangerousTaxiEnv,
    encode_state,
    taxi_dynamics,
)
from reflect_trl.reflection import get_oracle_reflector
from reflect_trl.reflection.base import ReflectionContext
from reflect_trl.reflection.taxi_oracle import TaxiOracleReflector

MISTAKE_WORDS = ("mistake", "wrong")


def _context(env: DangerousTaxiEnv, previous=None, last: int | None = None, oracle_before: int | None = None):
    return ReflectionContext(
        env=env,
        observation=env.observation,
        step=env.t,
        oracle_action=env.oracle_action(),
        previous_observation=previous,
        last_action=None if last is None else ACTIONS[last],
        last_action_was_oracle=None if last is None else last == oracle_before,
    )


def _after(env: DangerousTaxiEnv, action: int) -> ReflectionContext:
    """Take ``action`` and return the context of the new decision point."""
    previous, oracle_before = env.observation, env.oracle_action()
    env.step(action)
    return _context(env, previous, action, oracle_before)


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


def test_first_step_is_only_a_plan_naming_the_next_action():
    env = DangerousTaxiEnv(mode="full")
    env.reset_to_state(encode_state(2, 0, 1, 2))  # passenger at G (0, 4), two rows north, four columns east
    ctx = _context(env)
    text = TaxiOracleReflector().reflect(ctx, random.Random(0))
    assert ctx.oracle_action_text in text
    assert len(_sentences(text)) == 1
    assert not any(word in text.lower() for word in MISTAKE_WORDS)
    assert "passenger" in text


def test_deterministic_for_a_seed_and_varied_across_seeds():
    env = DangerousTaxiEnv(mode="full")
    env.reset_to_state(encode_state(2, 2, 0, 3))
    ctx = _after(env, EAST)  # away from the passenger at R: a mistake
    reflector = TaxiOracleReflector()
    assert reflector.reflect(ctx, random.Random(5)) == reflector.reflect(ctx, random.Random(5))
    variants = {reflector.reflect(ctx, random.Random(seed)) for seed in range(30)}
    assert len(variants) >= 5


def test_a_wrong_move_is_named_with_its_recovery():
    env = DangerousTaxiEnv(mode="full")
    env.reset_to_state(encode_state(2, 2, 0, 3))  # passenger waits at R (0, 0)
    assert env.oracle_action() != EAST
    ctx = _after(env, EAST)
    assert ctx.last_action_was_oracle is False
    for seed in range(20):
        text = TaxiOracleReflector().reflect(ctx, random.Random(seed))
        lower = text.lower()
        assert any(word in lower for word in MISTAKE_WORDS), text
        assert "east" in lower and "passenger" in lower, text
        assert ctx.oracle_action_text == "move west" and "move west" in text, text
        assert 2 <= len(_sentences(text)) <= 3 and len(text.split()) < 60, text


def test_a_wrong_dropoff_is_named_with_its_recovery():
    env = DangerousTaxiEnv(mode="dropoff")
    env.reset_to_state(encode_state(0, 0, 4, 1))  # passenger aboard on R, destination G
    ctx = _after(env, DROPOFF)
    assert ctx.oracle_action_text == "pickup passenger"
    for seed in range(10):
        text = TaxiOracleReflector().reflect(ctx, random.Random(seed))
        assert any(word in text.lower() for word in MISTAKE_WORDS) and "destination" in text
        assert "pickup passenger" in text


def test_an_equally_short_alternative_is_not_called_a_mistake():
    env = DangerousTaxiEnv(mode="full")
    env.reset_to_state(encode_state(1, 2, 3, 0))  # passenger at B (4, 3): south and east are both shortest
    dist = taxi_dynamics().distance[env.goal]
    assert env.oracle_action() == SOUTH
    assert dist[taxi_dynamics().next_state[env.state][EAST]] == dist[env.state] - 1
    ctx = _after(env, EAST)
    assert ctx.last_action_was_oracle is False
    text = TaxiOracleReflector().reflect(ctx, random.Random(0))
    assert not any(word in text.lower() for word in MISTAKE_WORDS), text
    assert ctx.oracle_action_text in text


def test_crash_is_explained_and_no_plan_follows():
    env = DangerousTaxiEnv(mode="full")
    env.reset_to_state(encode_state(0, 1, 0, 1))  # wall to the east
    previous, oracle_before = env.observation, env.oracle_action()
    env.step(EAST)
    ctx = ReflectionContext(
        env=env,
        observation=env.observation,
        step=env.t,
        oracle_action=oracle_before,
        previous_observation=previous,
        last_action=ACTIONS[EAST],
        last_action_was_oracle=False,
    )
    text = TaxiOracleReflector().reflect(ctx, random.Random(1))
    assert "crash" in text and "wall" in text and "mistake" in text
    assert len(_sentences(text)) == 1


def test_pickup_and_delivery_are_praised():
    env = DangerousTaxiEnv(mode="full")
    env.reset_to_state(encode_state(4, 0, 2, 0))  # taxi on Y with the passenger, destination R
    text = TaxiOracleReflector().reflect(_after(env, PICKUP), random.Random(2))
    assert "passenger" in text and not any(word in text.lower() for word in MISTAKE_WORDS)
    env.reset_to_state(encode_state(0, 0, 4, 0))
    text = TaxiOracleReflector().reflect(_after(env, DROPOFF), random.Random(2))
    assert "destination" in text and not any(word in text.lower() for word in MISTAKE_WORDS)


@pytest.mark.parametrize("mode", DangerousTaxiEnv.stages)
def test_many_episodes_with_injected_mistakes(mode):
    """Over noisy rollouts: short texts, the next action always named, no leaked vocabulary."""
    env = DangerousTaxiEnv(horizon=20, mode=mode)
    reflector = get_oracle_reflector("taxi")
    assert isinstance(reflector, TaxiOracleReflector)
    rng = random.Random(mode)
    mistakes = 0
    for seed in range(40):
        env.reset(seed=seed)
        ctx = _context(env)
        while True:
            text = reflector.reflect(ctx, rng)
            lower = text.lower()
            assert "oracle" not in lower and "optimal" not in lower, text
            assert len(text.split()) < 60 and 1 <= len(_sentences(text)) <= 3, text
            if not env.done:
                assert ctx.oracle_action_text in text, text
            if env.done:
                break
            oracle = env.oracle_action()
            safe = [
                a for a in range(6) if a != oracle and taxi_dynamics().next_state[env.state][a] != env.state
            ]
            action = rng.choice(safe) if safe and rng.random() < 0.4 else oracle
            dist = taxi_dynamics().distance[env.goal]
            detour = dist[taxi_dynamics().next_state[env.state][action]] >= dist[env.state]
            ctx = _after(env, action)
            if detour and not env.done:
                mistakes += 1
                text = reflector.reflect(ctx, rng)
                assert any(word in text.lower() for word in MISTAKE_WORDS), text
                assert ctx.oracle_action_text in text, text
    assert mistakes > 10
