"""RL math on hand-computed examples: returns, REINFORCE, RLOO, GiGPO, GAE, whitening, the turn-level PPO loss."""

from __future__ import annotations

import math

import pytest
import torch

from reflect_trl.rl_math import (
    approx_kl,
    episode_advantages,
    explained_variance,
    gae_advantages,
    gigpo_advantages,
    kl_over_options,
    reinforce_advantages,
    returns_to_go,
    rloo_advantages,
    turn_losses,
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
        [0.0, 0.0, 1.0],  # group 7, R = G_0 = 1
        [1.0],  # group 3, R = 1
        [0.0, -1.0],  # group 7, R = -1
        [0.0, 2.0],  # group 3, R = 2
        [3.0, 0.0, 0.0],  # group 3, R = 3
        [1.0, 1.0],  # group 9 (alone), R = 2
    ]
    groups = [7, 3, 7, 3, 3, 9]
    expected = [
        # K=2: baseline = the other episode's return, the same on every turn
        [1 - (-1)] * 3,
        # K=3: baseline = mean of the two others' returns; group total 6
        [1 - (6 - 1) / 2],
        [-1 - 1] * 2,
        [2 - (6 - 2) / 2] * 2,
        [3 - (6 - 3) / 2] * 3,
        # single-episode group: no baseline
        [2.0, 2.0],
    ]
    _close(rloo_advantages(episodes, groups), expected)
    # gamma is applied to the returns before the baseline: R = [0.5, 0]
    _close(rloo_advantages([[0.0, 1.0], [0.0, 0.0]], [0, 0], gamma=0.5), [[0.5, 0.5], [-0.5, -0.5]])
    with pytest.raises(ValueError, match="same length"):
        rloo_advantages(episodes, groups[:-1])


def test_rloo_hand_computed_group_of_three_unequal_lengths():
    """One return per episode (R = G_0, discounted), minus the mean of the other two, on every turn."""
    episodes = [
        [-0.1, -0.1, 1.0],  # R = -0.1 - 0.09 + 0.81 = 0.62
        [-0.1, 1.0],  # R = -0.1 + 0.9 = 0.8
        [-0.1, -0.1, -0.1, -1.0],  # R = -0.1 - 0.09 - 0.081 - 0.729 = -1.0
    ]
    expected = [
        [0.62 - (0.8 - 1.0) / 2] * 3,  # 0.72
        [0.8 - (0.62 - 1.0) / 2] * 2,  # 0.99
        [-1.0 - (0.62 + 0.8) / 2] * 4,  # -1.71
    ]
    _close(rloo_advantages(episodes, [0, 0, 0], gamma=0.9), expected)
    _close([a[0] for a in expected], [0.72, 0.99, -1.71])


def test_rloo_successes_of_different_lengths_are_equal_at_gamma_one():
    """Terminal reward only, gamma = 1: two successes of lengths 3 and 5 are worth the same, so no turn of either is
    pushed (aligning by turn index with G = 0 after the end paid the longer one +1 on its two extra turns)."""
    adv = rloo_advantages([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0, 1.0]], [0, 0], gamma=1.0)
    _close(adv, [[0.0] * 3, [0.0] * 5])


def test_rloo_discount_prefers_the_shorter_success():
    adv = rloo_advantages([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0, 1.0]], [0, 0], gamma=0.9)
    diff = 0.9**2 - 0.9**4
    _close(adv, [[diff] * 3, [-diff] * 5])
    assert all(a > 0 for a in adv[0]) and all(a < 0 for a in adv[1])


def test_rloo_single_episode_group_has_no_baseline():
    _close(rloo_advantages([[0.5, -0.2, 1.0]], [4]), [[1.3, 1.3, 1.3]])
    # R = 0.5 - 0.1 + 0.25 = 0.65 at gamma 0.5; a lone episode next to another task's group is unaffected by it
    _close(
        rloo_advantages([[0.5, -0.2, 1.0], [1.0], [0.0]], [4, 5, 5], gamma=0.5),
        [[0.65] * 3, [1.0], [-1.0]],
    )


def test_rloo_advantages_sum_to_zero_over_a_group():
    adv = rloo_advantages([[1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 3.0]], [0, 0, 0])
    assert sum(a[0] for a in adv) == pytest.approx(0.0, abs=1e-12)
    assert all(len(set(a)) == 1 for a in adv)


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


def _two_option_table(logp: torch.Tensor) -> torch.Tensor:
    """(B, 2) option tables whose option 0 has log-prob ``logp`` (differentiable in ``logp``)."""
    return torch.stack([logp, torch.log1p(-logp.exp())], dim=-1)


def _chosen(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.long)


def _value_terms(values, old, returns, clip=0.2):
    zeros = torch.zeros_like(values)
    return turn_losses(
        _two_option_table(zeros - 0.5),
        _chosen(len(values)),
        zeros - 0.5,
        zeros,
        clip_low=0.2,
        clip_high=0.2,
        values=values,
        old_values=old,
        returns=returns,
        value_clip=clip,
    )


def test_clipped_value_loss_inactive_clip():
    # |V - V_old| = 0.1 < 0.2: no clipping, loss = 0.5 * (1.0 - 2.0)^2
    terms = _value_terms(torch.tensor([1.0]), torch.tensor([0.9]), torch.tensor([2.0]))
    assert terms.value.item() == pytest.approx(0.5)
    assert terms.value_clipped.item() == 0.0


def test_clipped_value_loss_active_clip():
    values, old, returns = torch.tensor([1.9, 2.0]), torch.tensor([1.0, 1.0]), torch.tensor([2.0, 1.0])
    terms = _value_terms(values, old, returns)
    # row 0: clipped V = 1.2 -> max((1.9-2)^2, (1.2-2)^2) = 0.64 (clipped term wins)
    # row 1: clipped V = 1.2 -> max((2-1)^2, (1.2-1)^2) = 1.0 (unclipped term wins)
    torch.testing.assert_close(terms.value, torch.tensor([0.5 * 0.64, 0.5 * 1.0]))
    torch.testing.assert_close(terms.value_clipped, torch.tensor([1.0, 0.0]))
    # gradients flow only through the winning term
    v = values.clone().requires_grad_(True)
    _value_terms(v, old, returns).value.sum().backward()
    torch.testing.assert_close(v.grad, torch.tensor([0.0, 2.0 - 1.0]))


def test_clipped_surrogate_by_hand():
    # ratios e^{0.5} = 1.65 (clipped above for A > 0), e^{-0.5} = 0.61 (clipped below for A < 0), 1.1 (inside)
    old = torch.full((4,), -1.5)
    logp = old + torch.tensor([0.5, -0.5, math.log(1.1), 0.5])
    adv = torch.tensor([2.0, -1.0, 3.0, -2.0])
    terms = turn_losses(_two_option_table(logp), _chosen(4), old, adv, clip_low=0.2, clip_high=0.3)
    r = torch.exp(logp - old)
    expected = torch.tensor(
        [
            -1.3 * 2.0,
            -(0.8 * -1.0),
            -(1.1 * 3.0),
            -(r[3].item() * -2.0),
        ]  # row 3: A < 0, r > 1: unclipped is min
    )
    torch.testing.assert_close(terms.policy, expected)
    torch.testing.assert_close(terms.clipped, torch.tensor([1.0, 1.0, 0.0, 1.0]))
    assert terms.kl is None and terms.value is None
    # gradient vanishes exactly where the clipped term is the minimum
    lp = logp.clone().requires_grad_(True)
    turn_losses(
        _two_option_table(lp), _chosen(4), old, adv, clip_low=0.2, clip_high=0.3
    ).policy.sum().backward()
    assert lp.grad[0] == 0 and lp.grad[1] == 0
    assert lp.grad[2].item() == pytest.approx(-3.0 * 1.1)


def test_kl_to_reference_is_exact_over_the_offered_options_and_zero_at_equality():
    logp = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-1.0, -1.5])
    terms = turn_losses(
        _two_option_table(logp),
        _chosen(2),
        logp,
        torch.zeros(2),
        clip_low=0.2,
        clip_high=0.2,
        ref_log_probs=_two_option_table(ref),
    )
    p, q = logp.exp(), ref.exp()
    exact = p * (logp - ref) + (1 - p) * (torch.log1p(-p) - torch.log1p(-q))
    torch.testing.assert_close(terms.kl, exact)
    assert terms.kl[0].item() == 0.0 and terms.kl[1].item() > 0
    # options not offered (-inf in both tables) add nothing
    table = torch.tensor([[-0.5, -1.0, float("-inf")]]).log_softmax(-1)
    ref3 = torch.tensor([[-1.0, -0.5, float("-inf")]]).log_softmax(-1)
    kl = kl_over_options(table, ref3)
    want = (table[0, :2].exp() * (table[0, :2] - ref3[0, :2])).sum()
    torch.testing.assert_close(kl[0], want)


def test_approx_kl_and_explained_variance():
    assert approx_kl(torch.tensor([0.0]), torch.tensor([0.0])).item() == 0.0
    assert approx_kl(torch.tensor([0.3]), torch.tensor([0.0])).item() == pytest.approx(
        math.exp(0.3) - 1 - 0.3, rel=1e-5
    )
    returns = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(returns, returns) == pytest.approx(1.0)
    assert explained_variance(torch.full((4,), 2.5), returns) == pytest.approx(0.0)
    assert math.isnan(explained_variance(torch.zeros(3), torch.ones(3)))


# -- GiGPO ------------------------------------------------------------------------------------------------------
def test_gigpo_same_state_different_actions_get_opposite_step_advantages():
    # Task 0, two episodes: both start in state "s0"; episode 0 then succeeds (+1), episode 1 crashes (-0.5).
    rewards = [[0.0, 1.0], [-0.5]]
    keys = [["s0", "s1"], ["s0"]]
    adv, stats = gigpo_advantages(rewards, [0, 0], keys, gamma=1.0, step_weight=1.0, scale="none")
    # A_E: returns 1.0 and -0.5, mean 0.25 -> +0.75 / -0.75; A_S in s0: G = 1.0 and -0.5 -> +0.75 / -0.75;
    # s1 is seen once -> A_S = 0.
    _close(adv, [[1.5, 0.75], [-1.5]])
    assert stats.grouped_share == pytest.approx(2 / 3)
    assert stats.mean_group_size == pytest.approx(1.5)
    # with the std scale: each group of two values {x, -x} becomes {+1, -1} / sqrt(2) * ... (sample std)
    adv_std, _ = gigpo_advantages(rewards, [0, 0], keys, gamma=1.0, scale="group")
    s = 1.5 / math.sqrt(2)  # sample std of {1.0, -0.5}
    _close(adv_std, [[0.75 / s + 0.75 / s, 0.75 / s], [-0.75 / s - 0.75 / s]], tol=1e-5)


def test_gigpo_discounted_step_returns():
    # Same state reached at different turns: G uses gamma from that turn on.
    rewards = [[0.0, 0.0, 1.0], [0.0, 1.0]]
    keys = [["a", "b", "c"], ["x", "b"]]  # state "b" at turn 1 of ep 0 (G = 0.9) and turn 1 of ep 1 (G = 1.0)
    adv, _ = gigpo_advantages(rewards, [0, 0], keys, gamma=0.9, step_weight=0.5, scale="none")
    # returns equal (1.0 and 1.0) -> A_E = 0; A_S(b): 0.9 vs 1.0 -> -0.05 / +0.05, times omega = 0.5
    _close(adv, [[0.0, -0.025, 0.0], [0.0, 0.025]])


def test_gigpo_singletons_and_equal_returns_give_zero():
    adv, stats = gigpo_advantages(
        [[1.0], [0.0]], [0, 1], [["a"], ["a"]], gamma=1.0
    )  # groups never cross tasks
    _close(adv, [[0.0], [0.0]])
    assert stats.grouped_share == 0.0
    adv, _ = gigpo_advantages([[0.0, 1.0], [0.0, 1.0]], [0, 0], [["a", "b"], ["a", "b"]], gamma=1.0)
    _close(adv, [[0.0, 0.0], [0.0, 0.0]])


def test_gigpo_with_omega_zero_is_the_episode_level_estimator():
    rewards = [[0.0, 1.0], [-0.5], [0.2, 0.2, 0.0]]
    keys = [["a", "b"], ["a"], ["a", "c", "b"]]
    adv, _ = gigpo_advantages(rewards, [0, 0, 0], keys, gamma=0.95, step_weight=0.0, scale="group")
    totals = [1.0, -0.5, 0.4]
    mean = sum(totals) / 3
    std = (sum((t - mean) ** 2 for t in totals) / 2) ** 0.5
    _close(
        adv, [[(t - mean) / (std + 1e-6)] * len(r) for t, r in zip(totals, rewards, strict=True)], tol=1e-6
    )


def test_gigpo_is_invariant_to_episode_order():
    rewards = [[0.0, 1.0], [-0.5], [0.2, 0.2, 0.0], [0.0, 0.0]]
    keys = [["a", "b"], ["a"], ["a", "c", "b"], ["z", "a"]]
    groups = [0, 0, 1, 1]
    adv, _ = gigpo_advantages(rewards, groups, keys, gamma=0.9)
    order = [3, 1, 2, 0]
    adv_perm, _ = gigpo_advantages(
        [rewards[i] for i in order], [groups[i] for i in order], [keys[i] for i in order], gamma=0.9
    )
    _close([adv_perm[order.index(i)] for i in range(4)], adv, tol=1e-12)


def test_gigpo_rejects_mismatched_keys():
    with pytest.raises(ValueError, match="episode 0: 2 rewards but 1 state keys"):
        gigpo_advantages([[0.0, 1.0]], [0], [["a"]])


def test_explained_variance_from_moments_matches_the_direct_one():
    from reflect_trl.rl_math import explained_variance_from_moments

    returns, values = torch.tensor([1.0, 2.0, 0.5, 4.0]), torch.tensor([0.8, 2.5, 0.0, 3.0])
    d = returns - values
    got = explained_variance_from_moments(4, returns.sum(), (returns**2).sum(), d.sum(), (d**2).sum())
    assert got == pytest.approx(explained_variance(values, returns), rel=1e-5)


def test_gigpo_std_floor_keeps_discount_only_differences_small():
    """Two successes that differ only by discounting (0.95^2 vs 0.95^4): scaled by their tiny std they become +-0.7;
    with a floor of 0.1 on the std they stay a small fraction of a crash-vs-success difference."""
    rewards = [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0, 1.0]]
    keys = [["a", "b", "c"], ["a", "d", "e", "f", "g"]]
    blown_up, _ = gigpo_advantages(rewards, [0, 0], keys, gamma=0.95, step_weight=1.0, scale="group")
    floored, _ = gigpo_advantages(
        rewards, [0, 0], keys, gamma=0.95, step_weight=1.0, scale="group", std_floor=0.1
    )
    g = [0.95**2, 0.95**4]
    assert blown_up[0][0] == pytest.approx(1 / math.sqrt(2), abs=1e-3)  # (g - mean) / std of two values
    assert floored[0][0] == pytest.approx((g[0] - sum(g) / 2) / (0.1 + 1e-6), rel=1e-6)
    assert abs(floored[0][0]) < 0.5 and floored[0][0] == pytest.approx(-floored[1][0])
    crash, _ = gigpo_advantages([[1.0], [-0.5]], [0, 0], [["a"], ["a"]], scale="group", std_floor=0.1)
    assert crash[0][0] > 1.0  # a real difference is still scaled by its own (larger) std


def test_episode_advantages_dispatches_each_estimator():
    rewards, groups = [[0.0, 1.0], [-0.5]], [0, 0]
    assert episode_advantages("rloo", rewards, groups, gamma=1.0).advantages == rloo_advantages(
        rewards, groups
    )
    gae = episode_advantages("gae", rewards, groups, gamma=1.0, values=[[0.0, 0.0], [0.0]], gae_lambda=1.0)
    assert gae.value_targets == [[1.0, 1.0], [-0.5]]
    assert episode_advantages("gigpo", rewards, groups, gamma=1.0, state_keys=[["a", "b"], ["a"]]).step_groups
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        episode_advantages("ppo2", rewards, groups, gamma=1.0)
