"""benchmarks/focused_rl.py: the training split restricted to chosen start states, outcomes per start state."""

from __future__ import annotations

import json

import pytest

from _benchmarks import load_benchmark


@pytest.fixture(scope="module")
def focused():
    return load_benchmark("focused_rl")


def test_train_tasks_start_only_in_focused_states(focused, monkeypatch):
    monkeypatch.setattr(focused.FocusedTaxi, "focus", frozenset({96, 477}))
    env = focused.FocusedTaxi()
    tasks = env.make_tasks("train", 16, seed=0, difficulty="dropoff")
    assert len(tasks) == 16 and {t.data["start_state"] for t in tasks} == {96, 477}
    assert len({t.seed for t in tasks}) == 16  # distinct tasks, not one task repeated
    held_out = env.make_tasks("validation", 30, seed=0, difficulty="dropoff")
    assert held_out == focused.DangerousTaxiEnv().make_tasks("validation", 30, seed=0, difficulty="dropoff")
    monkeypatch.setattr(focused.FocusedTaxi, "focus", frozenset({123456}))
    with pytest.raises(ValueError, match=r"no dropoff training task starts in \[123456\]"):
        env.make_tasks("train", 1, seed=0, difficulty="dropoff")


def test_outcomes_by_start_state(focused, tmp_path):
    rows = [(96, False), (17, True), (96, False)]
    path = tmp_path / "t.jsonl"
    path.write_text(
        "".join(json.dumps({"task": {"data": {"start_state": s}}, "success": ok}) + "\n" for s, ok in rows)
    )
    assert focused.outcomes_by_start_state(path) == {96: False, 17: True}
