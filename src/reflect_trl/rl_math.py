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
* ``gae`` — generalised advantage estimation over turns with a learned value V(s_t):
      delta_t = r_t + gamma * V(s_{t+1}) * (1 - done_t) - V(s_t)
      A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}
      R_t     = A_t + V(s_t)                                  (value target)
  and the clipped value loss of PPO:
      L_V = 1/2 * max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2)

Optional whitening: A <- (A - mean(A)) / (std(A) + 1e-8).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

ADVANTAGE_ESTIMATORS = ("reinforce", "rloo", "gae")


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


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss (mean over the batch) and the fraction of clipped values."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    loss_unclipped = (values - returns) ** 2
    loss_clipped = (clipped - returns) ** 2
    loss = 0.5 * torch.maximum(loss_unclipped, loss_clipped).mean()
    clip_frac = (loss_clipped > loss_unclipped).float().mean()
    return loss, clip_frac
