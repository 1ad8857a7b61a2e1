"""RL math on hand-computed examples: returns, REINFORCE, RLOO, GAE, whitening, clipped value loss."""

from __future__ import annotations

import math

import pytest
import torch

from reflect_trl.rl_math import (
    clipped_value_loss,
    gae_advantages,
    reinforce_advantages,
    returns_to_go,
    rloo_advantages,
    whiten,
)


def _close(actual, expected, tol=1e-9):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        if isinstance(e, list):
            _close(a, e, tol)
        else:
            assert a == pytest.approx(e, abs=tol), (actual, expected)


def test_returns_to_go():
    _close(returns_to_go([1.0, 2.0, 3.0]), [6.0, 5.0, 3.0])
    # G2 = 3, G1 = 2 + 0.9 * 3 = 4.7, G0 = 1 + 0.9 * 4.7 = 5.23
    _close(returns_to_go([1.0, 2.0, 3.0], gamma=0.9), [5.23, 4.7, 3.0])
    _close(returns_to_go([0.0, 0.0, 1.0], gamma=0.5), [0.25, 0.5, 1.0])
    assert returns_to_go([]) == []


def test_reinforce_with_and_without_batch_baseline():
    episodes = [[1.0, 2.0, 3.0], [1.0]]
    _close(reinforce_advantages(episodes), [[6.0, 5.0, 3.0], [1.0]])
    # batch mean of all G: (6 + 5 + 3 + 1) / 4 = 3.75
    _close(reinforce_advantages(episodes, baseline="batch"), [[2.25, 1.25, -0.75], [-2.75]])
    _close(reinforce_advantages([[1.0, 1.0]], gamma=0.5, baseline="none"), [[1.5, 1.0]])
    with pytest.raises(ValueError, match="unknown REINFORCE baseline 'mean'"):
        reinforce_advantages(episodes, baseline="mean")


def test_rloo_groups_of_two_and_three_with_different_lengths():
    episodes = [
        [0.0, 0.0, 1.0],  # group 7, G = [1, 1, 1]
        [1.0],  # group 3, G = [1]
        [0.0, -1.0],  # group 7, G = [-1, -1]
        [0.0, 2.0],  # group 3, G = [2, 2]
        [3.0, 0.0, 0.0],  # group 3, G = [3, 0, 0]
        [1.0, 1.0],  # group 9 (alone), G = [2, 1]
    ]
    groups = [7, 3, 7, 3, 3, 9]
    expected = [
        # K=2: baseline = the other episode's G_t (0 once it has ended)
        [1 - (-1), 1 - (-1), 1 - 0],
        # K=3: baseline = mean of the two others' G_t; group totals per t: [6, 2, 0]
        [1 - (6 - 1) / 2],
        [-1 - 1, -1 - 1],
        [2 - (6 - 2) / 2, 2 - (2 - 2) / 2],
        [3 - (6 - 3) / 2, 0 - (2 - 0) / 2, 0 - 0 / 2],
        # single-episode group: no baseline
        [2.0, 1.0],
    ]
    _close(rloo_advantages(episodes, groups), expected)
    # gamma is applied to the returns before the baseline
    _close(rloo_advantages([[0.0, 1.0], [0.0, 0.0]], [0, 0], gamma=0.5), [[0.5, 1.0], [-0.5, -1.0]])
    with pytest.raises(ValueError, match="same length"):
        rloo_advantages(episodes, groups[:-1])


def test_rloo_advantages_sum_to_zero_for_equal_length_group():
    adv = rloo_advantages([[1.0, 0.0], [0.0, 0.0], [0.0, 3.0]], [0, 0, 0])
    for t in range(2):
        assert sum(a[t] for a in adv) == pytest.approx(0.0, abs=1e-12)


def test_gae_hand_computed():
    rewards, values = [1.0, 0.0, 2.0], [0.5, 1.0, 1.5]
    # t=2 (terminal): delta = 2 - 1.5 = 0.5                          A2 = 0.5
    # t=1: delta = 0 + 0.9 * 1.5 - 1.0 = 0.35                         A1 = 0.35 + 0.9 * 0.8 * 0.5 = 0.71
    # t=0: delta = 1 + 0.9 * 1.0 - 0.5 = 1.4                          A0 = 1.4 + 0.72 * 0.71 = 1.9112
    adv, ret = gae_advantages(rewards, values, gamma=0.9, lam=0.8)
    _close(adv, [1.9112, 0.71, 0.5])
    _close(ret, [1.9112 + 0.5, 0.71 + 1.0, 0.5 + 1.5])
    # lambda = 0: one-step TD errors
    adv0, _ = gae_advantages(rewards, values, gamma=0.9, lam=0.0)
    _close(adv0, [1.4, 0.35, 0.5])


def test_gae_lambda_one_gamma_one_is_monte_carlo_minus_value():
    rewards, values = [-0.05, -0.05, 1.0, -0.5], [0.3, -0.2, 0.9, 0.1]
    adv, ret = gae_advantages(rewards, values, gamma=1.0, lam=1.0)
    mc = returns_to_go(rewards, 1.0)
    _close(adv, [g - v for g, v in zip(mc, values, strict=True)], tol=1e-12)
    _close(ret, mc, tol=1e-12)
    adv_g, _ = gae_advantages(rewards, values, gamma=0.9, lam=1.0)
    _close(adv_g, [g - v for g, v in zip(returns_to_go(rewards, 0.9), values, strict=True)], tol=1e-12)
    with pytest.raises(ValueError, match="same length"):
        gae_advantages([1.0], [0.0, 1.0])


def test_whiten():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    out = whiten(x)
    std = math.sqrt(5.0 / 3.0)  # unbiased std of 1..4
    torch.testing.assert_close(out, (x - 2.5) / (std + 1e-8))
    assert out.mean().item() == pytest.approx(0.0, abs=1e-7)
    assert whiten(torch.tensor([3.0])).tolist() == [0.0]
    assert torch.isfinite(whiten(torch.tensor([2.0, 2.0, 2.0]))).all()


def test_clipped_value_loss_inactive_clip():
    # |V - V_old| = 0.1 < 0.2: no clipping, loss = 0.5 * (1.0 - 2.0)^2
    loss, frac = clipped_value_loss(torch.tensor([1.0]), torch.tensor([0.9]), torch.tensor([2.0]), clip=0.2)
    assert loss.item() == pytest.approx(0.5)
    assert frac.item() == 0.0


def test_clipped_value_loss_active_clip():
    values, old, returns = torch.tensor([1.9, 2.0]), torch.tensor([1.0, 1.0]), torch.tensor([2.0, 1.0])
    loss, frac = clipped_value_loss(values, old, returns, clip=0.2)
    # row 0: clipped V = 1.2 -> max((1.9-2)^2, (1.2-2)^2) = 0.64 (clipped term wins)
    # row 1: clipped V = 1.2 -> max((2-1)^2, (1.2-1)^2) = 1.0 (unclipped term wins)
    assert loss.item() == pytest.approx(0.5 * (0.64 + 1.0) / 2)
    assert frac.item() == pytest.approx(0.5)
    # gradients flow only through the winning term
    v = values.clone().requires_grad_(True)
    clipped_value_loss(v, old, returns, clip=0.2)[0].backward()
    torch.testing.assert_close(v.grad, torch.tensor([0.0, 0.5 * (2.0 - 1.0)]))
