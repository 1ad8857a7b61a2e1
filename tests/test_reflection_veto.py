"""benchmarks/reflection_veto.py: the action a reflection recommends (reflect_trl.model_reflections), the crash check on a copy of the live env, and the
veto actor's replacement rules (tiny model, a handful of DangerousTaxi episodes)."""

from __future__ import annotations

import pytest
import torch

from _benchmarks import load_benchmark
from reflect_trl.envs import make_env
from reflect_trl.envs.taxi import ACTIONS
from reflect_trl.model_reflections import recommended_action
from reflect_trl.prompts import build_prompt
from reflect_trl.rollout import Episode, LiveEpisode, RolloutEngine


@pytest.fixture(scope="module")
def veto():
    """benchmarks/reflection_veto.py, imported as a module."""
    return load_benchmark("reflection_veto")


def test_recommended_action_is_the_last_action_mentioned():
    text = "Moving west brought me to row 0, col 0. The passenger waits north, so I should move north."
    assert recommended_action(text, ACTIONS) == ACTIONS.index("move north")
    assert recommended_action("no action here", ACTIONS) is None
    assert recommended_action(None, ACTIONS) is None
    assert recommended_action("move west, then move north", ACTIONS) == ACTIONS.index("move north")


def test_crash_check_leaves_the_live_env_untouched(veto):
    env = make_env("taxi")
    env.reset_to_state(0, "full")  # taxi at row 0, col 0: north and west hit the edge
    view = LiveEpisode(env, Episode(task=env.task, seed=0), build_prompt(env.render(), ACTIONS))
    assert veto.crashes(view, ACTIONS.index("move north"))
    assert veto.crashes(view, ACTIONS.index("move west"))
    assert not veto.crashes(view, ACTIONS.index("move south"))
    assert env.t == 0 and not env.crashed and env.render() == view.prompt.text.split("\n# ")[0].rstrip("\n")


@pytest.mark.parametrize("mode", ["oracle", "next"])
def test_veto_actor_never_crashes_when_every_crash_is_vetoed(veto, tiny_model_dir, mode):
    """With an unlimited veto no episode ends in a crash (the oracle's action and the best non-crashing option never
    crash); with a limit of 0 the actor is the plain greedy policy."""
    model, tok, head = veto.load_policy(tiny_model_dir)
    tasks = make_env("taxi").make_tasks("validation", 6, seed=0, difficulty="full")
    torch.manual_seed(0)
    vetoed = RolloutEngine("taxi", veto.VetoActor(model, tok, head, mode, 10**6)).run(tasks)
    assert not any(ep.crashed for ep in vetoed)
    plain = RolloutEngine("taxi", veto.VetoActor(model, tok, head, mode, 0)).run(tasks)
    greedy = RolloutEngine("taxi", veto.PolicyActor(model, tok, head, greedy=True)).run(tasks)
    assert any(ep.crashed for ep in greedy), "the untrained policy crashes: the vetoes above had work to do"
    assert [[t.action_index for t in ep.turns] for ep in plain] == [
        [t.action_index for t in ep.turns] for ep in greedy
    ]
