"""Curriculum: fixed-step and success-rate schedules, validation, checkpoint round trip."""

from __future__ import annotations

import pytest

from reflect_trl.curriculum import Curriculum, FailurePriorities

STAGES = ("pickup", "dropoff", "full")


def test_steps_schedule_default_thirds():
    cur = Curriculum(STAGES, schedule="steps", max_steps=90)
    assert list(cur.stage_starts) == [0, 30, 60]
    seen = []
    for step in range(0, 100):
        promoted = cur.update(step)
        seen.append((step, cur.stage, promoted))
    assert [s for s, _, p in seen if p] == [30, 60]
    assert seen[29][1] == "pickup" and seen[30][1] == "dropoff" and seen[59][1] == "dropoff"
    assert seen[60][1] == "full" and seen[99][1] == "full"
    assert cur.is_last


def test_steps_schedule_custom_starts_and_jumps():
    cur = Curriculum(STAGES, schedule="steps", stage_starts=[0, 5, 7])
    assert cur.update(4) is False and cur.stage == "pickup"
    assert cur.update(8) is True and cur.stage == "full", "a late update jumps straight to the due stage"
    assert cur.update(2) is False and cur.stage == "full", "stages never go back"


def test_steps_schedule_first_start_after_zero_stays_on_first_stage():
    cur = Curriculum(STAGES, schedule="steps", stage_starts=[3, 5, 7])
    assert cur.update(0) is False
    assert cur.stage == "pickup"
    assert cur.update(5) is True and cur.stage == "dropoff"


def test_steps_schedule_validation_errors():
    with pytest.raises(ValueError, match="must be sorted"):
        Curriculum(STAGES, stage_starts=[0, 10, 5])
    with pytest.raises(ValueError, match="one per stage"):
        Curriculum(STAGES, stage_starts=[0, 10])
    with pytest.raises(ValueError, match="at least one stage"):
        Curriculum([], max_steps=10)
    with pytest.raises(ValueError, match="unknown curriculum schedule 'linear'"):
        Curriculum(STAGES, schedule="linear")


def test_success_schedule_promotes_only_on_full_window_above_threshold():
    cur = Curriculum(STAGES, schedule="success", threshold=0.75, window=4)
    assert cur.update(0, [True, True, True]) is False, "window not full yet"
    assert cur.stage == "pickup" and cur.success_rate == 1.0
    assert cur.update(1, [False]) is True, "4 episodes at 0.75 reach the threshold"
    assert cur.stage == "dropoff" and cur.success_rate == 0.0, "the window restarts after promotion"
    assert cur.update(2, [True, False, False, True]) is False  # 0.5 < 0.75
    assert cur.update(3, [True]) is False  # window slides: [F, F, T, T] = 0.5
    assert cur.update(4, [True]) is True  # [F, T, T, T] = 0.75
    assert cur.stage == "full" and cur.is_last
    for step in range(5, 10):
        assert cur.update(step, [True] * 8) is False, "never past the last stage"
    assert cur.stage == "full"


def test_success_schedule_ignores_step_count():
    cur = Curriculum(STAGES, schedule="success", threshold=0.5, window=2, max_steps=3)
    assert cur.update(10_000, []) is False
    assert cur.stage == "pickup"


def test_state_dict_round_trip():
    cur = Curriculum(STAGES, schedule="success", threshold=0.9, window=5)
    cur.update(0, [True] * 5)
    cur.update(1, [True, False, True])
    state = cur.state_dict()
    assert state == {"stage_index": 1, "recent": [True, False, True], "stages": list(STAGES)}
    restored = Curriculum(STAGES, schedule="success", threshold=0.9, window=5)
    restored.load_state_dict(state)
    assert restored.stage == "dropoff" and restored.success_rate == pytest.approx(2 / 3)
    # Both continue identically.
    assert cur.update(2, [True, True]) == restored.update(2, [True, True])
    assert cur.state_dict() == restored.state_dict()
    with pytest.raises(ValueError, match="differ"):
        Curriculum(("depth1", "depth2")).load_state_dict(state)


def test_steps_state_dict_round_trip():
    cur = Curriculum(STAGES, schedule="steps", max_steps=9)
    cur.update(4)
    restored = Curriculum(STAGES, schedule="steps", max_steps=9)
    restored.load_state_dict(cur.state_dict())
    assert restored.stage == cur.stage == "dropoff"


# ------------------------------------------------------------------------------------------ FailurePriorities
def test_failure_priorities_start_uniform_and_follow_failures():
    pri = FailurePriorities(uniform_share=0.5, alpha=0.5)
    keys = ["a", "b", "b", "c"]  # two tasks pose instance "b"
    assert pri.weights(keys) == pytest.approx([0.25] * 4)  # never drawn: all score 1
    pri.update([("a", True), ("a", True), ("b", False), ("b", True), ("c", True), ("c", True)])
    assert pri.scores == {"a": 0.0, "b": 0.5, "c": 0.0}
    # rho / N + (1 - rho) * s_i / sum s: b's tasks share the prioritised half
    assert pri.weights(keys) == pytest.approx([0.125, 0.375, 0.375, 0.125])
    assert sum(pri.weights(keys)) == pytest.approx(1.0)
    pri.update([("b", True), ("b", True)])  # smoothed: 0.5 * 0.5 + 0.5 * 0
    assert pri.score("b") == pytest.approx(0.25)
    for _ in range(6):  # one update per rollout, however many episodes it held
        pri.update([("b", True)] * 4)
    assert pri.score("b") == pytest.approx(0.25 / 2**6)
    assert pri.weights(["a", "c"]) == pytest.approx([0.5, 0.5])  # every score 0: uniform


def test_failure_priorities_unseen_instances_rank_first():
    pri = FailurePriorities(uniform_share=0.0, alpha=1.0)
    pri.update([("seen", False)])  # failure rate 1, as high as an unseen instance's optimistic score
    pri.update([("solved", True)])
    w = pri.weights(["seen", "solved", "new"])
    assert w == pytest.approx([0.5, 0.0, 0.5])


def test_failure_priorities_state_dict_round_trip():
    pri = FailurePriorities(uniform_share=0.3, alpha=0.25)
    pri.update([("x", False), ("x", True), ("y", True)])
    restored = FailurePriorities(uniform_share=0.3, alpha=0.25)
    restored.load_state_dict(pri.state_dict())
    assert restored.weights(["x", "y", "z"]) == pri.weights(["x", "y", "z"])


@pytest.mark.parametrize(("share", "alpha", "message"), [(1.5, 0.5, "uniform_share"), (0.5, 0.0, "alpha")])
def test_failure_priorities_reject_out_of_range(share, alpha, message):
    with pytest.raises(ValueError, match=message):
        FailurePriorities(uniform_share=share, alpha=alpha)
