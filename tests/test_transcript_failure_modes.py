"""benchmarks/transcript_failure_modes.py: optimal-action sets, turn shares and episode endings on hand-built
DangerousTaxi transcripts."""

from __future__ import annotations

import json
import sys

import pytest

from _benchmarks import load_benchmark
from reflect_trl.envs import make_env
from reflect_trl.envs.taxi import ACTIONS, shortest_plan, taxi_dynamics


@pytest.fixture(scope="module")
def fm():
    return load_benchmark("transcript_failure_modes")


def _episode(task, actions, reflections):
    """A transcript in the evaluation's format, played through the real environment."""
    env = make_env("taxi")
    env.reset(task=task)
    turns, success, crashed = [], False, False
    for action, reflection in zip(actions, reflections, strict=True):
        turns.append({"action": ACTIONS[action], "reflection": reflection})
        _, _, terminated, truncated, info = env.step(action)
        success, crashed = bool(info["success"]), bool(info["crash"])
        if terminated or truncated:
            break
    return {
        "task": task.__dict__ | {"data": dict(task.data)},
        "success": success,
        "crashed": crashed,
        "turns": turns,
    }


def test_optimal_actions_include_every_shortest_route_start(fm):
    env = make_env("taxi")
    task = env.make_tasks("test", 1, seed=0, difficulty="pickup")[0]
    env.reset(task=task)
    best = fm.optimal_actions(env.state, env.goal)
    assert env.oracle_action() in best
    for a in range(len(ACTIONS)):  # every optimal action shortens the remaining route by exactly one
        twin = env.clone()
        twin.step(a)
        if a in best and not twin.success:
            assert twin.oracle_distance() == env.oracle_distance() - 1
        elif a not in best and not twin.crashed:
            assert twin.oracle_distance() >= env.oracle_distance()


def test_shares_and_endings(fm, tmp_path):
    env = make_env("taxi")
    task = env.make_tasks("test", 1, seed=3, difficulty="pickup")[0]
    env.reset(task=task)
    plan = shortest_plan(env.state, env.goal)
    right = [f"so I should {ACTIONS[a]}." for a in plan]
    solved = _episode(task, plan, right)  # follows right reflections to the goal
    # a move with no effect in the start state (into a wall or the edge, or a wrong pickup / drop-off) crashes
    env.reset(task=task)
    wall = next(a for a in range(len(ACTIONS)) if taxi_dynamics().next_state[env.state][a] == env.state)
    followed = _episode(task, [wall], [f"I should {ACTIONS[wall]}."])
    deviated = _episode(
        task, [wall], [f"I should {ACTIONS[plan[0]]}."]
    )  # crashes against a right recommendation
    result = fm.analyse([solved, followed, deviated])
    n = len(plan) + 2
    assert result["turns"] == n and result["episodes"] == 3
    assert result["reflection_optimal"] == pytest.approx(round((len(plan) + 1) / n, 4))
    assert result["follows_reflection"] == pytest.approx(round((len(plan) + 1) / n, 4))
    assert result["deviates_from_right"] == pytest.approx(round(1 / n, 4))
    assert result["deviates_from_wrong"] == 0.0
    assert result["outcomes"] == {
        "success": 1,
        "crash_on_named_wrong_action": 1,
        "crash_against_optimal_recommendation": 1,
    }
    # a transcript whose recorded outcome disagrees with its replay is refused
    with pytest.raises(RuntimeError, match="disagrees"):
        fm.analyse([dict(followed, success=True)])
    # the command over a reproduce folder
    folder = tmp_path / "seed_0" / "eval" / "transcripts"
    folder.mkdir(parents=True)
    for conf in fm.CONFIGURATIONS:
        for stage in fm.STAGES:
            name = fm.safe_filename(f"{conf}__{stage}__greedy") + ".jsonl"
            (folder / name).write_text("\n".join(json.dumps(e) for e in (solved, followed)) + "\n")
    argv, sys.argv = sys.argv, ["x", "--reproduce_dir", str(tmp_path)]
    try:
        fm.main()
    finally:
        sys.argv = argv
    written = json.loads((tmp_path / "failure_modes.json").read_text())
    assert written["seeds"] == ["seed_0"] and len(written["rows"]) == 9
    assert written["rows"][0]["outcomes"] == {"success": 1, "crash_on_named_wrong_action": 1}
