"""Curriculum: fixed-step and success-rate schedules, validation, checkpoint round trip."""

from __future__ import annotations

import pytest

from reflect_trl.trainers.curriculum import Curriculum, TaskSampler

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


# ------------------------------------------------------------------------------------------------ TaskSampler
def test_task_sampler_draws_the_current_stage_and_resumes_its_rng():
    pools = {"a": [f"a{i}" for i in range(5)], "b": [f"b{i}" for i in range(3)]}
    sampler = TaskSampler(pools, Curriculum(["a", "b"], max_steps=10), seed=7)
    first = sampler.draw(6)
    assert set(first) <= set(pools["a"]) and len(first) == 6
    state = sampler.state_dict()
    sampler.curriculum.update(5)
    assert sampler.curriculum.stage == "b"
    after = sampler.draw(4)
    assert set(after) <= set(pools["b"])
    restored = TaskSampler(pools, Curriculum(["a", "b"], max_steps=10), seed=0)
    restored.load_state_dict(state)  # the RNG and the stage of the checkpoint, not of the seed
    restored.curriculum.update(5)
    assert restored.draw(4) == after
