"""The no-signal warning: a run whose task groups all got identical returns logs share 1 and warns once per stage;
a run with varied returns logs share 0 and stays quiet; a zero gradient norm for several steps warns too. The
no-success warning: rollouts without a successful episode warn once per stage, varied returns or not.

Episodes are played by hand (``ReflectPPOTrainer._play`` replaced), as in ``test_rl_wiring``."""

from __future__ import annotations

import logging

import torch
from test_rl_wiring import _episode, _prompts, _trainer

from reflect_trl.trainers.rl_logging import (
    NO_SIGNAL_PATIENCE,
    NO_SUCCESS_PATIENCE,
    NoSignalMonitor,
    signal_shares,
)

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


def _run(tiny_model_dir, tmp_path, caplog, rewards: tuple[float, float], warning: str = "no learning signal"):
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
    assert not any("no learning signal" in r.getMessage() for r in caplog.records if r.name == LOGGER)


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


def _train_on(tiny_model_dir, tmp_path, rewards: tuple[float, float], **overrides):
    """Two optimizer steps on hand-played rollouts whose returns are ``rewards`` in every group, from a
    policy moved away from its reference (so the KL term has a gradient); the parameters before and after."""
    trainer = _trainer(
        tiny_model_dir,
        tmp_path,
        max_steps=2,
        advantage_estimator="rloo",
        curriculum_stages=["pickup"],
        beta=0.05,
        **overrides,
    )
    _play_by_hand(trainer, rewards)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    return trainer, before, list(trainer.model.parameters())


def _changed(before, after) -> bool:
    return any(not torch.equal(b, a) for b, a in zip(before, after, strict=True))


def test_skip_no_signal_steps_leaves_the_policy_where_it_was(tiny_model_dir, tmp_path):
    # identical returns: every advantage is 0, the loss would be the KL pull to the reference alone
    trainer, before, after = _train_on(
        tiny_model_dir, tmp_path / "skip", (-1.0, -1.0), skip_no_signal_steps=True
    )
    assert not _changed(before, after)  # fresh AdamW, zero gradients: no update at all
    assert _logged(trainer, "signal/skipped_step_share") == [1.0, 1.0]
    # without the option the KL term alone moves the policy (back towards its reference)
    _, before, after = _train_on(tiny_model_dir, tmp_path / "pull", (-1.0, -1.0))
    assert _changed(before, after)


def test_skip_no_signal_steps_keeps_steps_that_carry_advantage(tiny_model_dir, tmp_path):
    trainer, before, after = _train_on(tiny_model_dir, tmp_path, (1.0, -1.0), skip_no_signal_steps=True)
    assert _changed(before, after)
    assert _logged(trainer, "signal/skipped_step_share") == [0.0, 0.0]
