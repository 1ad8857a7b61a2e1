"""TextGameOracleReflector: determinism, content and length (stub games; one check on a real TextWorld game)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from reflect_trl.envs.base import Observation
from reflect_trl.reflection import ReflectionContext, get_oracle_reflector
from reflect_trl.reflection.textgame_oracle import MAX_WORDS, TextGameOracleReflector

FORBIDDEN = ("oracle", "optimal", "walkthrough", "expert")


@dataclass
class StubGame:
    """The attributes the reflector reads from TextWorldEnv / ALFWorldEnv."""

    goal: str = "put some tomato on microwave"
    last_feedback: str = ""
    won: bool = False
    lost: bool = False
    done: bool = False
    plan: list[str] = field(default_factory=list)
    plan_known: bool = True

    def remaining_plan_length(self) -> int | None:
        return len(self.plan) if self.plan_known else None


ACTIONS = ("go to countertop 1", "go to microwave 1", "look", "take tomato 1 from countertop 1")


def context(game: StubGame, oracle: str, last: str | None = None, was_oracle: bool | None = None, reward=0.0):
    obs = Observation("state text", ACTIONS)
    return ReflectionContext(
        env=game,  # type: ignore[arg-type]
        observation=obs,
        step=0 if last is None else 1,
        oracle_action=ACTIONS.index(oracle),
        last_action=last,
        last_action_was_oracle=was_oracle,
        last_reward=reward,
    )


def test_registry_gives_the_same_reflector_for_both_games():
    assert isinstance(get_oracle_reflector("textworld"), TextGameOracleReflector)
    assert isinstance(get_oracle_reflector("alfworld"), TextGameOracleReflector)


def test_deterministic_for_a_seed_and_varied_across_seeds():
    game = StubGame(last_feedback="You arrive at countertop 1. On the countertop 1, you see a tomato 1.")
    game.plan = ["take tomato 1 from countertop 1", "go to microwave 1", "move tomato 1 to microwave 1"]
    ctx = context(game, "take tomato 1 from countertop 1", last="go to countertop 1", was_oracle=True)
    reflector = TextGameOracleReflector()
    texts = [reflector.reflect(ctx, random.Random(seed)) for seed in range(12)]
    assert texts == [reflector.reflect(ctx, random.Random(seed)) for seed in range(12)]
    assert len(set(texts)) >= 4


def test_first_step_names_goal_and_exact_next_command():
    game = StubGame(plan=["go to countertop 1", "take tomato 1 from countertop 1"])
    for seed in range(8):
        text = TextGameOracleReflector().reflect(context(game, "go to countertop 1"), random.Random(seed))
        assert '"go to countertop 1"' in text
        assert "tomato on microwave" in text or text.startswith(("First", "I start", "My first"))
        assert not any(word in text.lower() for word in FORBIDDEN)


def test_on_plan_step_reviews_feedback_and_plans_with_a_reason():
    game = StubGame(last_feedback="You arrive at countertop 1. On the countertop 1, you see a tomato 1.")
    game.plan = ["take tomato 1 from countertop 1", "go to microwave 1"]
    ctx = context(game, "take tomato 1 from countertop 1", last="go to countertop 1", was_oracle=True)
    for seed in range(8):
        text = TextGameOracleReflector().reflect(ctx, random.Random(seed))
        assert '"go to countertop 1"' in text and "tomato 1" in text
        assert "mistake" not in text.lower()
        assert '"take tomato 1 from countertop 1"' in text and (
            "because" in text or "since" in text or ":" in text
        )


def test_mistake_is_named_with_the_recovery():
    game = StubGame(
        last_feedback="You are in the middle of a room. Looking quickly around you, you see nothing."
    )
    game.plan = ["go to countertop 1", "take tomato 1 from countertop 1"]
    ctx = context(game, "go to countertop 1", last="look", was_oracle=False)
    for seed in range(8):
        text = TextGameOracleReflector().reflect(ctx, random.Random(seed))
        lower = text.lower()
        assert "mistake" in lower or "wrong" in lower
        assert '"go to countertop 1"' in text
        assert any(word in lower for word in ("recover", "back on track"))


def test_last_plan_step_and_end_of_game():
    game = StubGame(
        plan=["go to microwave 1"], last_feedback="You pick up the tomato 1 from the countertop 1."
    )
    ctx = context(game, "go to microwave 1", last="take tomato 1 from countertop 1", was_oracle=True)
    texts = {TextGameOracleReflector().reflect(ctx, random.Random(s)) for s in range(10)}
    assert any("complete" in t or "finishes" in t or "last step" in t for t in texts)

    won = StubGame(won=True, done=True, last_feedback="You move the tomato 1 to the microwave 1.")
    ctx = context(won, "look", last="go to microwave 1", was_oracle=True, reward=1.0)
    text = TextGameOracleReflector().reflect(ctx, random.Random(0))
    assert any(word in text for word in ("complete", "won", "reached")) and "Next" not in text

    unknown_length = StubGame(plan=["go to microwave 1"], plan_known=False)
    ctx = context(unknown_length, "go to microwave 1")
    assert "last step" not in TextGameOracleReflector().reflect(ctx, random.Random(0))


def test_long_feedback_keeps_reflection_short():
    game = StubGame(last_feedback=" ".join(["The room is full of very interesting things to look at."] * 12))
    game.plan = ["take tomato 1 from countertop 1", "go to microwave 1"]
    ctx = context(game, "take tomato 1 from countertop 1", last="look", was_oracle=False, reward=0.5)
    for seed in range(10):
        text = TextGameOracleReflector().reflect(ctx, random.Random(seed))
        assert len(text.split()) <= MAX_WORDS
        assert '"take tomato 1 from countertop 1"' in text


def test_rejects_other_environments():
    class NotAGame:
        pass

    ctx = context(StubGame(plan=["look"]), "look")
    ctx.env = NotAGame()  # type: ignore[assignment]
    with pytest.raises(TypeError, match="text-game environment"):
        TextGameOracleReflector().reflect(ctx, random.Random(0))


@pytest.mark.textworld
@pytest.mark.filterwarnings("ignore:Game .* is not fully supported")
def test_reflections_along_a_real_textworld_episode(tmp_path_factory):
    pytest.importorskip("textworld")
    from reflect_trl.envs import make_env

    cache = (
        tmp_path_factory.getbasetemp() / "textworld-game-cache"
    )  # shared with tests/envs/test_textworld.py
    cache.mkdir(exist_ok=True)
    settings = {"medium": {"world_size": 2}}
    env = make_env("textworld", cache_dir=str(cache), settings=settings, horizon=10)
    task = env.make_tasks("train", 2, seed=0)[1]
    obs = env.reset(task=task)
    reflector, last, was_oracle = get_oracle_reflector("textworld"), None, None
    rng = random.Random(0)
    while not env.done:
        oracle = env.oracle_action()
        ctx = ReflectionContext(env, obs, env.t, oracle, last_action=last, last_action_was_oracle=was_oracle)
        text = reflector.reflect(ctx, rng)
        assert f'"{obs.actions[oracle]}"' in text and len(text.split()) <= MAX_WORDS
        assert not any(word in text.lower() for word in FORBIDDEN)
        action = oracle if env.t != 0 else (oracle + 1) % len(obs.actions)  # one mistake at the start
        last, was_oracle = obs.actions[action], action == oracle
        obs, *_ = env.step(action)
        if not was_oracle:
            assert env.last_feedback
    env.close()
