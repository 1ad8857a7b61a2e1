"""The RL math of Reflect-RL, in one place (CleanRL style).

Everything here works on *turns*: one turn = one decision of the policy = one training sample. An episode
of length T has rewards r_0..r_{T-1}; the last turn is terminal (the horizon H is part of the task, so a
truncated episode is treated as terminal too).

Advantage estimators (``advantage_estimator``):

* ``reinforce`` — return-to-go (the paper's policy gradient, REINFORCE on the Monte-Carlo return)
      G_t = sum_{k>=t} gamma^(k-t) r_k,       A_t = G_t - b
  with b = 0, or the batch mean of G over all turns (``baseline="batch"``).
* ``rloo`` — leave-one-out baseline across the K episodes of the same task (same task, same turn index):
      A^i_t = G^i_t - 1/(K-1) * sum_{j != i} G^j_t          (G^j_t = 0 once episode j has ended)
  The baseline does not depend on episode i's actions, so the estimator stays unbiased.
* ``gigpo`` — group-in-group advantages (GiGPO, arXiv 2505.10978): an episode-level group advantage plus a
  step-level advantage over the turns of the task's episodes that stand in the *same environment state*
  (``TextEnv.state_key()``):
      A_E(i)   = (R^i - mean_{j in task} R^j) / F_E                     R^i = sum_t r^i_t (episode return)
      A_S(i,t) = (G^i_t - mean_{(j,u) in S(i,t)} G^j_u) / F_S           S(i,t) = turns of the task's episodes whose
                                                                          state key equals that of (i, t)
      A^i_t    = A_E(i) + omega * A_S(i,t)
  with G the discounted return-to-go (gamma), F the group's standard deviation (``scale="group"``) or 1
  (``"none"``), and A_S = 0 for a state seen once. Groups never cross tasks.
* ``gae`` — generalised advantage estimation over turns with a learned value V(s_t):
      delta_t = r_t + gamma * V(s_{t+1}) * (1 - done_t) - V(s_t)
      A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}
      R_t     = A_t + V(s_t)                                  (value target)
  and the clipped value loss of PPO:
      L_V = 1/2 * max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2)

Optional whitening: A <- (A - mean(A)) / (std(A) + 1e-8).
Optional down-weighting of positive advantages (Weighted-REINFORCE, Zhu et al. 2025, arXiv 2506.01347), after
whitening:  A <- lambda_+ * A where A > 0, A unchanged where A <= 0  (``positive_advantage_weight`` lambda_+; 1 = off,
0 = negative-sample reinforcement only: failing actions are pushed down, their probability flows to the others in
proportion to their own, and the successful ones are not sharpened).

The loss (:func:`turn_losses`, summed by the trainer over the real turns of an accumulation window):

* probability ratio        r_t   = exp(log pi_theta(a_t|s_t) - log pi_old(a_t|s_t))
* clipped surrogate (PPO)  L^CLIP_t = -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)
* KL to the reference      KL_t  = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1       (k3 estimator, >= 0)
* entropy over the options H_t   = -sum_o pi_theta(o|s_t) log pi_theta(o|s_t)       (offered options only)
* clipped value loss       L^V_t = 1/2 max((V_t - R_t)^2, (V_old,t + clip(V_t - V_old,t, -eps_v, eps_v) - R_t)^2)
* SFT anchor (PPO-ptx)     L^SFT_j = -log pi_theta(y_j|x_j)     over rows (x_j, y_j) of the policy's SFT data
* total                    L = 1/N sum_t [L^CLIP_t + beta KL_t - c_H H_t] + c_V / N_V sum_{t in V} L^V_t
                               + lambda_SFT / N_A sum_j L^SFT_j
  where N (N_V, N_A) is the number of real (value-carrying, anchor) turns in the optimizer step's accumulation
  window over all processes, so the gradient is the same on 1 or k processes and for any gradient accumulation.

Diagnostics: approx KL(old || new) = mean((r_t - 1) - log r_t); clip fraction = share of turns whose ratio left
[1 - eps_low, 1 + eps_high]; explained variance = 1 - Var(R - V) / Var(R).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NamedTuple

import torch

ADVANTAGE_ESTIMATORS = ("reinforce", "rloo", "gae", "gigpo")


def returns_to_go(rewards: Sequence[float], gamma: float = 1.0) -> list[float]:
    """G_t = r_t + gamma * G_{t+1}, computed backwards; G_T = 0."""
    out = [0.0] * len(rewards)
    running = 0.0
    for t in reversed(range(len(rewards))):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def reinforce_advantages(
    episodes_rewards: Sequence[Sequence[float]], gamma: float = 1.0, baseline: str = "none"
) -> list[list[float]]:
    """REINFORCE: A_t = G_t - b, with b = 0 (``"none"``) or the batch mean of all G_t (``"batch"``)."""
    returns = [returns_to_go(r, gamma) for r in episodes_rewards]
    if baseline == "none":
        return returns
    if baseline != "batch":
        raise ValueError(f"unknown REINFORCE baseline {baseline!r}; use 'none' or 'batch'")
    flat = [g for ep in returns for g in ep]
    b = sum(flat) / max(len(flat), 1)
    return [[g - b for g in ep] for ep in returns]


def rloo_advantages(
    episodes_rewards: Sequence[Sequence[float]], group_ids: Sequence[int], gamma: float = 1.0
) -> list[list[float]]:
    """Leave-one-out baseline over the episodes that share a ``group_id`` (same task), turn by turn.

    A group with a single episode has no baseline (A_t = G_t).
    """
    if len(episodes_rewards) != len(group_ids):
        raise ValueError("episodes_rewards and group_ids must have the same length")
    returns = [returns_to_go(r, gamma) for r in episodes_rewards]
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    advantages: list[list[float]] = [[] for _ in returns]
    for members in groups.values():
        k = len(members)
        horizon = max(len(returns[i]) for i in members)
        # totals[t] = sum_j G^j_t over the group (G^j_t = 0 after episode j ended)
        totals = [sum(returns[j][t] if t < len(returns[j]) else 0.0 for j in members) for t in range(horizon)]
        for i in members:
            if k == 1:
                advantages[i] = list(returns[i])
            else:
                advantages[i] = [g - (totals[t] - g) / (k - 1) for t, g in enumerate(returns[i])]
    return advantages


class StepGroupStats(NamedTuple):
    """How much the state grouping of :func:`gigpo_advantages` did in one batch."""

    grouped_share: float  # share of turns whose step group has more than one turn
    mean_group_size: float  # mean number of turns per step group (distinct task x state)
    step_advantage_std: float  # standard deviation of A_S over all turns


def _centre_and_scale(values: list[float], scale: str) -> list[float]:
    """(x - mean) / F with F = sample std + 1e-6 (``"group"``) or 1 (``"none"``); a single value gives 0."""
    if len(values) < 2:
        return [0.0] * len(values)
    mean = sum(values) / len(values)
    centred = [v - mean for v in values]
    if scale == "none":
        return centred
    if scale != "group":
        raise ValueError(f"unknown scale {scale!r}; use 'group' or 'none'")
    std = (sum(c * c for c in centred) / (len(values) - 1)) ** 0.5
    return [c / (std + 1e-6) for c in centred]


def gigpo_advantages(
    episodes_rewards: Sequence[Sequence[float]],
    group_ids: Sequence[int],
    state_keys: Sequence[Sequence[Hashable]],
    gamma: float = 0.95,
    step_weight: float = 1.0,
    scale: str = "group",
) -> tuple[list[list[float]], StepGroupStats]:
    """GiGPO's A = A_E + omega * A_S (module docstring); ``state_keys[i][t]`` is the key of episode i's state
    before its turn t. Returns the per-turn advantages and :class:`StepGroupStats`."""
    if not len(episodes_rewards) == len(group_ids) == len(state_keys):
        raise ValueError("episodes_rewards, group_ids and state_keys must have the same length")
    for i, (r, k) in enumerate(zip(episodes_rewards, state_keys, strict=True)):
        if len(r) != len(k):
            raise ValueError(f"episode {i}: {len(r)} rewards but {len(k)} state keys")
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    # Episode level: A_E over the episodes of each task.
    episode_adv = [0.0] * len(episodes_rewards)
    for members in groups.values():
        returns_of_group = [float(sum(episodes_rewards[i])) for i in members]
        for i, a in zip(members, _centre_and_scale(returns_of_group, scale), strict=True):
            episode_adv[i] = a
    # Step level: A_S over the turns of each task's episodes that share a state key.
    returns = [returns_to_go(r, gamma) for r in episodes_rewards]
    step_adv = [[0.0] * len(r) for r in episodes_rewards]
    sizes: list[int] = []
    grouped_turns = 0
    for members in groups.values():
        by_state: dict[Hashable, list[tuple[int, int]]] = {}
        for i in members:
            for t, key in enumerate(state_keys[i]):
                by_state.setdefault(key, []).append((i, t))
        for turns in by_state.values():
            sizes.append(len(turns))
            if len(turns) > 1:
                grouped_turns += len(turns)
            for (i, t), a in zip(
                turns, _centre_and_scale([returns[i][t] for i, t in turns], scale), strict=True
            ):
                step_adv[i][t] = a
    advantages = [
        [episode_adv[i] + step_weight * a for a in step_adv[i]] for i in range(len(episodes_rewards))
    ]
    flat = [a for ep in step_adv for a in ep]
    n = len(flat)
    mean = sum(flat) / n if n else 0.0
    std = (sum((a - mean) ** 2 for a in flat) / n) ** 0.5 if n else 0.0
    stats = StepGroupStats(
        grouped_share=grouped_turns / n if n else 0.0,
        mean_group_size=sum(sizes) / len(sizes) if sizes else 0.0,
        step_advantage_std=std,
    )
    return advantages, stats


def gae_advantages(
    rewards: Sequence[float], values: Sequence[float], gamma: float = 1.0, lam: float = 0.95
) -> tuple[list[float], list[float]]:
    """Turn-level GAE(gamma, lambda) for one episode whose last turn is terminal. Returns (advantages, returns)."""
    if len(rewards) != len(values):
        raise ValueError("rewards and values must have the same length")
    n = len(rewards)
    advantages = [0.0] * n
    next_advantage = 0.0
    for t in reversed(range(n)):
        not_done = 1.0 if t < n - 1 else 0.0
        next_value = values[t + 1] if t < n - 1 else 0.0
        delta = rewards[t] + gamma * next_value * not_done - values[t]
        next_advantage = delta + gamma * lam * not_done * next_advantage
        advantages[t] = next_advantage
    returns = [a + v for a, v in zip(advantages, values, strict=True)]
    return advantages, returns


def whiten(values: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / (std + eps); a single value is only centred."""
    if values.numel() < 2:
        return values - values.mean()
    return (values - values.mean()) / (values.std() + eps)


def weight_positive(values: torch.Tensor, weight: float) -> torch.Tensor:
    """Weighted-REINFORCE: positive advantages times ``weight``, the others as they are."""
    return torch.where(values > 0, values * weight, values)


# ----------------------------------------------------------------------------------------------------- the loss
class TurnLosses(NamedTuple):
    """Per-turn loss terms (shape (B,)) of :func:`turn_losses`; the trainer masks and normalises them."""

    policy: torch.Tensor  # L^CLIP_t
    kl: torch.Tensor | None  # KL_t to the reference policy (None without one)
    entropy: torch.Tensor  # H_t
    value: torch.Tensor | None  # L^V_t (None without a value head)
    ratio: torch.Tensor  # r_t (detached)
    clipped: torch.Tensor  # 1.0 where r_t left [1 - eps_low, 1 + eps_high]
    value_clipped: torch.Tensor | None  # 1.0 where the clipped value loss was the larger one


def turn_losses(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    entropy: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    ref_logp: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    old_values: torch.Tensor | None = None,
    returns: torch.Tensor | None = None,
    value_clip: float = 0.2,
) -> TurnLosses:
    """The per-turn PPO terms of the module docstring for one batch of turns (every input has shape (B,))."""
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)  # r_t
    clipped_ratio = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    policy = -torch.min(ratio * advantages, clipped_ratio * advantages)  # L^CLIP_t
    kl = None
    if ref_logp is not None:
        log_ref_ratio = ref_logp - logp  # log(pi_ref / pi_theta)
        kl = torch.exp(log_ref_ratio) - log_ref_ratio - 1.0  # k3 estimator of KL(pi_theta || pi_ref)
    value = value_clipped = None
    if values is not None:
        if old_values is None or returns is None:
            raise ValueError("turn_losses: a value loss needs old_values and returns")
        unclipped = (values - returns) ** 2
        v_clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
        clipped = (v_clipped - returns) ** 2
        value = 0.5 * torch.maximum(unclipped, clipped)  # L^V_t
        value_clipped = (clipped > unclipped).float()
    out_of_range = (ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)
    return TurnLosses(policy, kl, entropy, value, ratio.detach(), out_of_range.float(), value_clipped)


def anchor_nll(logp: torch.Tensor) -> torch.Tensor:
    """Per-row SFT anchor term L^SFT_j = -log pi_theta(y_j|x_j) (InstructGPT's pretraining-mix term, on the policy's
    SFT rows): a plain cross-entropy, no ratio, no clipping, no advantage."""
    return -logp


def approx_kl(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """Per-turn k3 estimate of KL(pi_old || pi_theta): (r - 1) - log r (>= 0, exact in expectation)."""
    log_ratio = (logp - old_logp).detach()
    return torch.exp(log_ratio) - 1.0 - log_ratio


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R): 1 is a perfect value function, 0 no better than a constant (nan if Var(R) = 0)."""
    if returns.numel() < 2:
        return float("nan")
    var_returns = returns.var()
    if var_returns == 0:
        return float("nan")
    return float(1.0 - (returns - values).var() / var_returns)


def explained_variance_from_moments(n: float, r_sum: float, r_sq: float, d_sum: float, d_sq: float) -> float:
    """:func:`explained_variance` from the sums n, sum R, sum R^2, sum (R - V), sum (R - V)^2 (population
    variances; for combining the turns of several processes)."""
    if n < 2:
        return float("nan")
    var_returns = r_sq / n - (r_sum / n) ** 2
    if var_returns <= 1e-12:
        return float("nan")
    return 1.0 - (d_sq / n - (d_sum / n) ** 2) / var_returns
