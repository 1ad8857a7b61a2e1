"""benchmarks/crash_reflection_rows.py: a Taxi policy row's state is rebuilt exactly by replaying its task and the
actions its prompt lists (negative-example rows included), and only reflections recommending a crash become rows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from _benchmarks import load_benchmark
from reflect_trl.data_builder import DataBuilderConfig, generate_rows
from reflect_trl.envs.taxi import ACTIONS
from reflect_trl.model_reflections import split_policy_prompt


@pytest.fixture(scope="module")
def probe():
    """benchmarks/crash_reflection_rows.py, imported as a module."""
    return load_benchmark("crash_reflection_rows")


@pytest.fixture(scope="module")
def policy_rows(tmp_path_factory):
    config = DataBuilderConfig(
        env_name="taxi", n_train_tasks=4, n_val_tasks=1, negative_prob=1.0, seed=3,
        output_dir=str(tmp_path_factory.mktemp("data")),
    )  # fmt: skip
    rows, _ = generate_rows(config)
    return rows["policy_reflect"]["train"]


def test_replay_rebuilds_every_row_state(probe, policy_rows):
    assert any(r["is_negative"] for r in policy_rows) and any(r["step"] > 3 for r in policy_rows)
    for row in policy_rows:
        env = probe.replay(row)
        assert env.render() == split_policy_prompt(row["prompt"])[0]
        assert env.oracle_action() == row["action_index"]


def test_replay_refuses_a_row_whose_history_does_not_match(probe, policy_rows):
    row = next(r for r in policy_rows if r["step"] >= 1)
    wrong = dict(row, seed=row["seed"] + 1)
    with pytest.raises(ValueError, match=f"row {row['task_id']} step {row['step']}"):
        probe.replay(wrong)


def test_only_reflections_that_recommend_a_crash_become_rows(probe, policy_rows):
    """A scripted reflector recommends every action in turn: exactly the crashing non-target ones are added."""
    rows = policy_rows[:12]

    class Cycle:
        calls = 0

        def generate(self, prompts):
            Cycle.calls += 1
            return SimpleNamespace(texts=[f"so I should {ACTIONS[Cycle.calls - 1]}." for _ in prompts])

    added = []
    for k in range(len(ACTIONS)):
        added += probe.crash_rows(rows, Cycle(), samples=1)
        expected = []
        for row in rows:
            env = probe.replay(row)
            if k != row["action_index"] and env.step(k)[4]["crash"]:
                expected.append(row["task_id"])
        assert [r["task_id"] for r in added[len(added) - len(expected) :]] == expected
    assert added, "some recommended moves crash"
    for row in added:
        assert row["reflection_source"] == "model_crash"
        state, reflection, _ = split_policy_prompt(row["prompt"])
        assert probe.replay(row).render() == state
        assert reflection.startswith("so I should ")
