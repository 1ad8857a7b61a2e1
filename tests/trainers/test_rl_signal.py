"""The no-signal warning: a rollout without signal has a zero advantage on every turn (identical returns alone are a
metric); a stage warns once when half of its rollouts so far, and at least 2, had none (or 3 in a row, or a zero
gradient norm for 3 logged steps), and the run ends with "k of n rollouts had no learning signal" per stage. The
no-success warning: rollouts without a successful episode warn once per stage, varied returns or not.
``skip_no_signal_steps``: no optimizer or scheduler step on a window without advantage, even with a warm AdamW.

Episodes are played by hand (``ReflectPPOTrainer._play`` replaced), as in ``test_rl_wiring``."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from test_rl_wiring import _episode, _prompts, _trainer
from transformers import TrainerCallback

from reflect_trl.trainers.rl_logging import (
    NO_SIGNAL_PATIENCE,
    NO_SUCCESS_PATIENCE,
    NoSignalMonitor,
    signal_shares,
)
from reflect_trl.trainers.signal_guard import check_skip_supported

LOGGER = "reflect_trl.trainers.rl_logging"


def _play_by_hand(trainer, rewards: tuple[float, float]) -> None:
    """Every rollout of ``trainer`` becomes two groups of two one-turn episodes on `pickup` with returns ``rewards``
    (an episode succeeds when its reward is positive)."""
    (p0, n0), (p1, n1) = _prompts(trainer._tokenizer, 2)
    task = trainer.tasks.pools["pickup"][0]
    trainer._play = lambda tasks, groups, state: [
        _episode(task, 0, [(p0, n0, 1, rewards[0], "a")]),
        _episode(task, 0, [(p0, n0, 2, rewards[1], "a")]),
        _episode(task, 1, [(p1, n1, 0, rewards[0], "b")]),
        _episode(task, 1, [(p1, n1, 3, rewards[1], "b")]),
    ]


def _run(
    tiny_model_dir, tmp_path, caplog, rewards: tuple[float, float], warning: str = "RL has no learning signal"
):
    """A run of one rollout per step past both warnings' patience (curriculum on one stage) whose every rollout is
    two groups of two one-turn episodes (an episode succeeds when its reward is positive); the warnings that contain
    ``warning``."""
    trainer = _trainer(
        tiny_model_dir,
        tmp_path,
        max_steps=max(NO_SIGNAL_PATIENCE, NO_SUCCESS_PATIENCE) + 1,
        advantage_estimator="rloo",
        curriculum_stages=["pickup"],
    )
    _play_by_hand(trainer, rewards)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        trainer.train()
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER and warning in r.getMessage()]
    return trainer, warnings


def _logged(trainer, key: str) -> list[float]:
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def test_identical_groups_warn_once_per_stage(tiny_model_dir, tmp_path, caplog):
    trainer, warnings = _run(tiny_model_dir, tmp_path, caplog, rewards=(-1.0, -1.0))
    shares = _logged(trainer, "signal/identical_return_group_share")
    assert shares and all(s == 1.0 for s in shares)
    assert all(s == 1.0 for s in _logged(trainer, "signal/zero_advantage_turn_share"))
    assert len(warnings) == 1
    assert (
        "'pickup'" in warnings[0]
        and "num_generations" in warnings[0]
        and "reflection_temperature" in warnings[0]
    )
    no_success = [r for r in caplog.records if r.name == LOGGER and "No episode" in r.getMessage()]
    assert len(no_success) == 1  # identical failures are also success-free: both warnings, each once


def test_success_free_rollouts_warn_once_per_stage_even_with_varied_returns(tiny_model_dir, tmp_path, caplog):
    # returns differ within every group (a learning signal), but no episode succeeds: RL learns from failures only
    trainer, warnings = _run(tiny_model_dir, tmp_path, caplog, rewards=(-1.0, -2.0), warning="No episode")
    assert all(s == 0.0 for s in _logged(trainer, "signal/identical_return_group_share"))
    assert len(warnings) == 1
    assert "'pickup'" in warnings[0] and f"for {NO_SUCCESS_PATIENCE} rollouts in a row" in warnings[0]
    assert not any("RL has no learning signal" in r.getMessage() for r in caplog.records if r.name == LOGGER)


def test_varied_returns_with_successes_do_not_warn(tiny_model_dir, tmp_path, caplog):
    trainer, warnings = _run(tiny_model_dir, tmp_path, caplog, rewards=(1.0, -1.0), warning="")
    shares = _logged(trainer, "signal/identical_return_group_share")
    assert shares and all(s == 0.0 for s in shares)
    assert all(s == 0.0 for s in _logged(trainer, "signal/zero_advantage_turn_share"))
    assert warnings == []


def test_signal_shares_count_groups_and_turns():
    # group 0 identical, group 1 varied, group 2 a single episode (not compared)
    identical, compared, zero = signal_shares([1.0, 1.0, 0.0, 2.0, 5.0], [0, 0, 1, 1, 2], [0.0, 0.5, 0.0])
    assert (identical, compared, zero) == (1.0, 2.0, 2.0)


def test_monitor_needs_a_streak_and_warns_once_per_stage():
    monitor = NoSignalMonitor(patience=3)
    assert [monitor.update("pickup", "grad_norm", True) for _ in range(2)] == [None, None]
    assert monitor.update("pickup", "grad_norm", False) is None  # the streak breaks
    assert [monitor.update("pickup", "grad_norm", True) is not None for _ in range(4)] == [
        False,
        False,
        True,
        False,
    ]
    for _ in range(2):
        assert monitor.update("full", "grad_norm", True) is None
    message = monitor.update("full", "grad_norm", True)
    assert message is not None and "'full'" in message and "gradient norm was 0" in message


def test_monitor_counts_success_apart_from_signal():
    monitor = NoSignalMonitor(patience=2, success_patience=3)
    assert [monitor.update("dropoff", "rollout", True) for _ in range(2)][-1] is not None  # no signal: warned
    # the no-success streak has its own patience and its own once-per-stage warning
    assert [monitor.update("dropoff", "success", True) is not None for _ in range(4)] == [
        False,
        False,
        True,
        False,
    ]
    assert monitor.update("full", "success", False) is None  # a new stage, a success: no streak
    assert [monitor.update("full", "success", True) is not None for _ in range(3)] == [False, False, True]


def test_monitor_warns_when_half_of_a_short_stage_had_no_signal():
    monitor = NoSignalMonitor()
    assert monitor.update("pickup", "rollout", True) is None  # 1 of 1: not yet 2
    message = monitor.update("pickup", "rollout", True)  # 2 of 2
    assert message is not None and "'pickup'" in message and "2 of its 2 rollouts" in message
    assert [monitor.update("dropoff", "rollout", x) for x in (True, False, False, False)] == [None] * 4
    assert monitor.update("dropoff", "rollout", True) is None  # 2 of 5: under half
    assert monitor.update("dropoff", "rollout", True) is not None  # 3 of 6
    for _ in range(20):
        monitor.update("full", "rollout", False)
    late = [monitor.update("full", "rollout", True) is not None for _ in range(3)]
    assert late == [False, False, True]  # a long stage whose signal dies: 3 in a row
    assert monitor.summary() == (
        "8 of 31 rollouts had no learning signal (zero advantage on every turn); per curriculum stage: "
        "'pickup' 2 of 2, 'dropoff' 3 of 6, 'full' 3 of 23"
    )


def _summaries(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and "rollouts had no learning" in r.getMessage()
    ]


def test_identical_returns_with_advantages_are_a_signal(tiny_model_dir, tmp_path, caplog):
    # every group ended alike, but the groups differ: REINFORCE's batch baseline gives every turn an advantage
    trainer = _trainer(
        tiny_model_dir, tmp_path, max_steps=4, advantage_estimator="reinforce", curriculum_stages=["pickup"],
        skip_no_signal_steps=True,
    )  # fmt: skip
    _play_rollouts(trainer, [((1.0, 1.0), (-1.0, -1.0))])
    with caplog.at_level(logging.INFO, logger=LOGGER):
        trainer.train()
    assert all(s == 1.0 for s in _logged(trainer, "signal/identical_return_group_share"))
    assert all(s == 0.0 for s in _logged(trainer, "signal/zero_advantage_turn_share"))
    assert _logged(trainer, "signal/skipped_step_share") == [0.0] * 4  # the skip agrees: every step taken
    assert not [
        r for r in caplog.records if r.name == LOGGER and "RL has no learning signal" in r.getMessage()
    ]
    assert _summaries(caplog) == [
        "0 of 4 rollouts had no learning signal (zero advantage on every turn); per curriculum stage: 'pickup' 0 of 4"
    ]


def test_short_stages_warn_and_the_run_ends_with_the_count(tiny_model_dir, tmp_path, caplog):
    # two stages of two rollouts: 'pickup' has no signal in 2 of 2 (a warning), 'dropoff' in 1 of 2 (none)
    trainer = _trainer(
        tiny_model_dir,
        tmp_path,
        max_steps=4,
        advantage_estimator="rloo",
        curriculum_stages=["pickup", "dropoff"],
    )
    flat, varied = ((-1.0, -1.0), (-1.0, -1.0)), ((1.0, -1.0), (1.0, -1.0))
    _play_rollouts(trainer, [flat, flat, varied, flat])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        trainer.train()
    warnings = [
        r.getMessage() for r in caplog.records if r.name == LOGGER and "RL has no learning" in r.getMessage()
    ]
    assert len(warnings) == 1 and "'pickup'" in warnings[0] and "2 of its 2 rollouts" in warnings[0]
    assert _summaries(caplog) == [
        "3 of 4 rollouts had no learning signal (zero advantage on every turn); per curriculum stage: "
        "'pickup' 2 of 2, 'dropoff' 1 of 2"
    ]


def _changed(before, after) -> bool:
    return any(not torch.equal(b, a) for b, a in zip(before, after, strict=True))


def _play_rollouts(trainer, rewards_per_rollout) -> None:
    """Rollout r of ``trainer`` becomes two groups of two one-turn episodes on `pickup`: group g's returns are
    ``rewards_per_rollout[r][g]`` (a pair each; the last entry repeats)."""
    (p0, n0), (p1, n1) = _prompts(trainer._tokenizer, 2)
    task = trainer.tasks.pools["pickup"][0]

    def play(tasks, groups, state):
        (a0, b0), (a1, b1) = rewards_per_rollout[min(trainer._rollouts, len(rewards_per_rollout) - 1)]
        return [
            _episode(task, 0, [(p0, n0, 1, a0, "a")]),
            _episode(task, 0, [(p0, n0, 2, b0, "a")]),
            _episode(task, 1, [(p1, n1, 0, a1, "b")]),
            _episode(task, 1, [(p1, n1, 3, b1, "b")]),
        ]

    trainer._play = play


class _Snapshot(TrainerCallback):
    """The parameters, the optimizer's state and the scheduler's position right after optimizer step ``step``."""

    def __init__(self, trainer, step: int) -> None:
        self.trainer, self.step, self.taken = trainer, step, None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.taken = _state_of(self.trainer)


def _state_of(trainer):
    params = [p.detach().clone() for p in trainer.model.parameters()]
    moments = [
        v.detach().clone()
        for s in trainer.optimizer.state_dict()["state"].values()
        for v in s.values()
        if torch.is_tensor(v)
    ]
    schedule = trainer.lr_scheduler
    return params, moments, (schedule.get_last_lr(), schedule.last_epoch, schedule._step_count)


def _warm_then_flat(tiny_model_dir, tmp_path, **overrides):
    """Two optimizer steps on rollouts with varied returns (AdamW gets momentum, the linear schedule moves), then two
    on rollouts whose every group ended alike (every advantage 0); the state after step 2 and at the end."""
    trainer = _trainer(
        tiny_model_dir, tmp_path, max_steps=4, advantage_estimator="rloo", curriculum_stages=["pickup"], beta=0.05,
        lr_scheduler_type="linear", weight_decay=0.1, save_strategy="steps", save_steps=4, **overrides,
    )  # fmt: skip
    _play_rollouts(
        trainer, [((1.0, -1.0), (-1.0, 1.0)), ((-1.0, 2.0), (1.0, 0.0)), ((-1.0, -1.0), (-1.0, -1.0))]
    )
    snapshot = _Snapshot(trainer, step=2)
    trainer.add_callback(snapshot)
    trainer.train()
    return trainer, snapshot.taken, _state_of(trainer)


def test_skip_no_signal_steps_takes_no_optimizer_or_scheduler_step(tiny_model_dir, tmp_path):
    trainer, (params, moments, schedule), (params_end, moments_end, schedule_end) = _warm_then_flat(
        tiny_model_dir, tmp_path / "skip", skip_no_signal_steps=True
    )
    assert _logged(trainer, "signal/skipped_step_share") == [0.0, 0.0, 1.0, 1.0]
    assert trainer.state.global_step == 4  # the Trainer still counts the skipped steps
    assert not _changed(params, params_end)  # no AdamW step: neither momentum nor weight decay moved a weight
    assert moments and not _changed(moments, moments_end)  # nor its moments and step count
    assert schedule == schedule_end  # the learning rate stays where step 2 left it
    assert (
        tmp_path / "skip" / "checkpoint-4" / "scheduler.pt"
    ).is_file()  # the guarded scheduler still saves
    # without the option the same flat steps move the weights (the warm optimizer, the KL term) and the schedule
    _, (params, _, schedule), (params_end, _, schedule_end) = _warm_then_flat(
        tiny_model_dir, tmp_path / "step"
    )
    assert _changed(params, params_end)
    assert schedule_end[1] == schedule[1] + 2 and schedule_end[0] != schedule[0]


def test_skip_no_signal_steps_keeps_steps_that_carry_advantage(tiny_model_dir, tmp_path):
    trainer = _trainer(
        tiny_model_dir, tmp_path, max_steps=2, advantage_estimator="rloo", curriculum_stages=["pickup"],
        skip_no_signal_steps=True,
    )  # fmt: skip
    _play_by_hand(trainer, (1.0, -1.0))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert _changed(before, list(trainer.model.parameters()))
    assert _logged(trainer, "signal/skipped_step_share") == [0.0, 0.0]


def test_skip_no_signal_steps_is_refused_under_deepspeed():
    # DeepSpeed's engine steps the optimizer and the scheduler inside backward, where no guard can skip them
    check_skip_supported(SimpleNamespace(skip_no_signal_steps=True), deepspeed=False)
    check_skip_supported(SimpleNamespace(skip_no_signal_steps=False), deepspeed=True)
    with pytest.raises(ValueError, match="DeepSpeed"):
        check_skip_supported(SimpleNamespace(skip_no_signal_steps=True), deepspeed=True)
