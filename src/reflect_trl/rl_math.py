"""The RL math of Reflect-RL, in one place (CleanRL style): advantages, their finalisation, and the whole objective.

Everything here works on *turns*: one turn = one decision of the policy = one training sample. An episode of length T
has rewards r_0..r_{T-1}; the last turn is terminal (the horizon H is part of the task, so a truncated episode is
treated as terminal too).

**1. Advantage estimators** (``advantage_estimator``, :func:`episode_advantages`):

* ``reinforce`` — return-to-go (the paper's policy gradient, REINFORCE on the Monte-Carlo return)
      G_t = sum_{k>=t} gamma^(k-t) r_k,       A_t = G_t - b
  with b = 0, or the batch mean of G over all turns (``baseline="batch"``).
* ``rloo`` — leave-one-out baseline across the K episodes of the same task, one value per episode (as TRL's and
  verl's RLOO):
      R^i = G^i_0 = sum_t gamma^t r^i_t,      A^i_t = R^i - 1/(K-1) * sum_{j != i} R^j     (every turn t of episode i)
  with A^i_t = R^i for a task with a single episode. Not aligned by turn index: episodes of different lengths have no
  common turn t, and counting an ended episode's G as 0 would pay the longer of two successes for its extra turns.
* ``gigpo`` — group-in-group advantages (GiGPO, arXiv 2505.10978): an episode-level group advantage plus a
  step-level advantage over the turns of the task's episodes that stand in the *same environment state*
  (``TextEnv.state_key()``):
      A_E(i)   = (R^i - mean_{j in task} R^j) / F_E                     R^i = sum_t r^i_t (episode return)
      A_S(i,t) = (G^i_t - mean_{(j,u) in S(i,t)} G^j_u) / F_S           S(i,t) = turns of the task's episodes whose
                                                                          state key equals that of (i, t)
      A^i_t    = A_E(i) + omega * A_S(i,t)
  with G the discounted return-to-go (gamma; GiGPO uses 0.95, which also penalises loops), F = max(std, F_min) of the
  group (``scale="group"``; the floor F_min keeps a group whose returns differ only by discounting from being
  blown up to +-1) or 1 (``"none"``), and A_S = 0 for a state seen once. Groups never cross tasks.
* ``gae`` — generalised advantage estimation over turns with a learned value V(s_t):
      delta_t = r_t + gamma * V(s_{t+1}) * (1 - done_t) - V(s_t)
      A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}
      R_t     = A_t + V(s_t)                                  (value target)

**2. Finalisation** (:func:`finalize_advantages`): optional whitening over the rollout batch,
A <- (A - mean(A)) / (std(A) + 1e-8) (``whiten_advantages``; off by default for ``gigpo``, whose advantages are
already group-normalised, on for the others).

**3. The objective** (:func:`turn_losses` per turn, :func:`window_mean` to normalise; the trainer adds them up):

* probability ratio        r_t   = exp(log pi_theta(a_t|s_t) - log pi_old(a_t|s_t))
* clipped surrogate (PPO)  L^CLIP_t = -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)
* KL to the reference      KL_t  = sum_o pi_theta(o|s_t) (log pi_theta(o|s_t) - log pi_ref(o|s_t))
                                   (exact, over the offered options o)
* entropy over the options H_t   = -sum_o pi_theta(o|s_t) log pi_theta(o|s_t)
* clipped value loss       L^V_t = 1/2 max((V_t - R_t)^2, (V_old,t + clip(V_t - V_old,t, -eps_v, eps_v) - R_t)^2)
* total                    L = 1/N sum_t [L^CLIP_t + beta KL_t - c_H H_t] + c_V / N_V sum_{t in V} L^V_t
  where N (N_V) is the number of real (value-carrying) turns in the optimizer step's accumulation window over all
  processes, so the gradient is the same on 1 or k processes and for any gradient accumulation.

**4. The reflection player's objective** (``train_reflection``, :func:`reflection_token_losses`): the turn's advantage
A_t trains the tokens y_1..y_n of the reflection the policy read at that turn, with a token-level clipped surrogate
normalised per turn (a long reflection weighs as much as a short one):

      rho_tj  = exp(log phi(y_j|x_t, y_<j) - log phi_old(y_j|x_t, y_<j))
      L^R_t   = 1/n_t sum_j -min(rho_tj A_t, clip(rho_tj, 1 - eps_low, 1 + eps_high) A_t)
      KL^R_t  = 1/n_t sum_j [phi_ref/phi - log(phi_ref/phi) - 1](y_j)   (k3 per token: the vocabulary is too large
                                                                          for the exact sum)
  and the total gains 1/N sum_t [L^R_t + beta_R KL^R_t] (the same N as the policy's turns).

  Which advantage A^R_t the reflection's tokens get (``reflection_reward``, :func:`reflection_advantages`):

* ``advantage`` — the policy's turn advantage, A^R_t = A_t (the reflection learns from what the policy's move earned);
* ``verified`` — a reward of the reflection's own, checked against the environment's oracle
  (:func:`verified_reflection_rewards`): with m_t the move the reflection names (``prompts.recommended_action``) and
  O_t the optimal moves of the state (``TextEnv.optimal_actions``),
      v_t = 1 if m_t in O_t,   0 if m_t names another legal move,   -c if it names none    (c: ``no_move_penalty``)
  made group-relative over the reflections sampled at the same state of the same task (GiGPO's anchor states,
  :func:`state_group_advantages`):
      A^V_t = (v_t - mean_{u in S(t)} v_u) / F_S       S(t): the task's turns whose state key equals t's
  and, for a state sampled once, the rollout's mean and std over all its reflections in place of the group's;
* ``mixed`` — A^R_t = (1 - w) A_t + w A^V_t (w: ``verified_weight``).

* ``oracle_sft`` (``reflection_objective``, a control): no advantage -- the reflection is trained by supervised
  fine-tuning, at the states the current pair visits, towards the oracle reflector's text z_t (DAgger):
      L^S_t = -1/|z_t| sum_j log phi(z_j | x_t, z_<j)

Diagnostics: approx KL(old || new) = mean((r_t - 1) - log r_t); clip fraction = share of turns whose ratio left
[1 - eps_low, 1 + eps_high]; explained variance = 1 - Var(R - V) / Var(R).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Sequence
from typing import NamedTuple

import torch

ADVANTAGE_ESTIMATORS = ("reinforce", "rloo", "gae", "gigpo")


# ------------------------------------------------------------------------------------------ 1. advantage estimators
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


def _groups(group_ids: Sequence[int]) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    return groups


def rloo_advantages(
    episodes_rewards: Sequence[Sequence[float]], group_ids: Sequence[int], gamma: float = 1.0
) -> list[list[float]]:
    """Leave-one-out baseline over the episodes that share a ``group_id`` (same task), one value per episode.

    R^i = G^i_0 (episode i's discounted return from its first turn) and A^i_t = R^i - mean_{j != i} R^j for every
    turn t of episode i, as in TRL's and verl's RLOO. A group with a single episode has no baseline (A^i_t = R^i).
    """
    if len(episodes_rewards) != len(group_ids):
        raise ValueError("episodes_rewards and group_ids must have the same length")
    episode_returns = [returns_to_go(r, gamma)[0] if len(r) else 0.0 for r in episodes_rewards]
    advantages: list[list[float]] = [[] for _ in episodes_rewards]
    for members in _groups(group_ids).values():
        k = len(members)
        total = sum(episode_returns[j] for j in members)
        for i in members:
            r = episode_returns[i]
            a = r if k == 1 else r - (total - r) / (k - 1)
            advantages[i] = [a] * len(episodes_rewards[i])
    return advantages


class StepGroupStats(NamedTuple):
    """How much the state grouping of :func:`gigpo_advantages` did in one batch."""

    grouped_share: float  # share of turns whose step group has more than one turn
    mean_group_size: float  # mean number of turns per step group (distinct task x state)
    step_advantage_std: float  # standard deviation of A_S over all turns


def _centre_and_scale(values: list[float], scale: str, std_floor: float = 0.0) -> list[float]:
    """(x - mean) / F with F = max(sample std, ``std_floor``) + 1e-6 (``"group"``) or 1 (``"none"``); a single value
    gives 0."""
    if len(values) < 2:
        return [0.0] * len(values)
    mean = sum(values) / len(values)
    centred = [v - mean for v in values]
    if scale == "none":
        return centred
    if scale != "group":
        raise ValueError(f"unknown scale {scale!r}; use 'group' or 'none'")
    std = (sum(c * c for c in centred) / (len(values) - 1)) ** 0.5
    return [c / (max(std, std_floor) + 1e-6) for c in centred]


def gigpo_advantages(
    episodes_rewards: Sequence[Sequence[float]],
    group_ids: Sequence[int],
    state_keys: Sequence[Sequence[Hashable]],
    gamma: float = 0.95,
    step_weight: float = 1.0,
    scale: str = "group",
    std_floor: float = 0.0,
) -> tuple[list[list[float]], StepGroupStats]:
    """GiGPO's A = A_E + omega * A_S (module docstring); ``state_keys[i][t]`` is the key of episode i's state
    before its turn t. Returns the per-turn advantages and :class:`StepGroupStats`."""
    if not len(episodes_rewards) == len(group_ids) == len(state_keys):
        raise ValueError("episodes_rewards, group_ids and state_keys must have the same length")
    for i, (r, k) in enumerate(zip(episodes_rewards, state_keys, strict=True)):
        if len(r) != len(k):
            raise ValueError(f"episode {i}: {len(r)} rewards but {len(k)} state keys")
    groups = _groups(group_ids)
    # Episode level: A_E over the episodes of each task.
    episode_adv = [0.0] * len(episodes_rewards)
    for members in groups.values():
        returns_of_group = [float(sum(episodes_rewards[i])) for i in members]
        for i, a in zip(members, _centre_and_scale(returns_of_group, scale, std_floor), strict=True):
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
            centred = _centre_and_scale([returns[i][t] for i, t in turns], scale, std_floor)
            for (i, t), a in zip(turns, centred, strict=True):
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


class EpisodeAdvantages(NamedTuple):
    """Per-turn advantages of a batch of episodes (:func:`episode_advantages`)."""

    advantages: list[list[float]]
    value_targets: list[list[float]] | None  # gae: R_t per turn
    step_groups: StepGroupStats | None  # gigpo: what the state grouping did


def episode_advantages(
    estimator: str,
    rewards: Sequence[Sequence[float]],
    groups: Sequence[int],
    *,
    gamma: float,
    state_keys: Sequence[Sequence[Hashable]] | None = None,
    values: Sequence[Sequence[float]] | None = None,
    gae_lambda: float = 0.95,
    reinforce_baseline: str = "batch",
    step_weight: float = 1.0,
    scale: str = "group",
    std_floor: float = 0.0,
) -> EpisodeAdvantages:
    """The advantage of every turn of every episode under ``estimator`` (section 1 of the module docstring):
    ``rewards[i][t]`` of episode i's turn t, ``groups[i]`` its task group, ``state_keys`` (gigpo) and ``values``
    (gae: the value head's V(s_t) at rollout time)."""
    if estimator == "reinforce":
        return EpisodeAdvantages(reinforce_advantages(rewards, gamma, reinforce_baseline), None, None)
    if estimator == "rloo":
        return EpisodeAdvantages(rloo_advantages(rewards, groups, gamma), None, None)
    if estimator == "gigpo":
        if state_keys is None:
            raise ValueError("gigpo needs the state key of every turn")
        advantages, stats = gigpo_advantages(
            rewards, groups, state_keys, gamma, step_weight, scale, std_floor
        )
        return EpisodeAdvantages(advantages, None, stats)
    if estimator == "gae":
        if values is None:
            raise ValueError("gae needs the value estimate of every turn")
        pairs = [gae_advantages(r, v, gamma, gae_lambda) for r, v in zip(rewards, values, strict=True)]
        return EpisodeAdvantages([a for a, _ in pairs], [g for _, g in pairs], None)
    raise ValueError(f"unknown advantage estimator {estimator!r}; choose one of {ADVANTAGE_ESTIMATORS}")


# ------------------------------------------------------------------------------------------------- 2. finalisation
#: An advantage (or a return difference) at most this large counts as zero: the turn carries no learning signal.
ZERO_ADVANTAGE_TOL = 1e-8


def whiten(values: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / (std + eps); a single value is only centred."""
    if values.numel() < 2:
        return values - values.mean()
    return (values - values.mean()) / (values.std() + eps)


def finalize_advantages(advantages: Sequence[float], whiten_advantages: bool) -> list[float]:
    """The advantages a rollout batch trains with: whitened over the batch when asked (section 2)."""
    if not whiten_advantages or not advantages:
        return list(advantages)
    return whiten(torch.tensor(list(advantages), dtype=torch.float32)).tolist()


# --------------------------------------------------------------------------------------------------- 3. the objective
def kl_over_options(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Exact KL(pi_theta || pi_ref) per row over the offered options: sum_o pi_theta(o) (log pi_theta(o) -
    log pi_ref(o)); both (B, L) tables are -inf where an option is not offered (those terms are 0)."""
    probs = log_probs.exp()
    offered = torch.isfinite(log_probs)
    diff = torch.where(offered, log_probs - ref_log_probs, torch.zeros_like(log_probs))
    return (probs * diff).sum(-1)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """The k3 estimator pi_ref/pi_theta - log(pi_ref/pi_theta) - 1 of KL(pi_theta || pi_ref) at the chosen action."""
    log_ref_ratio = ref_logp - logp
    return torch.exp(log_ref_ratio) - log_ref_ratio - 1.0


def entropy_from_log_probs(log_probs: torch.Tensor) -> torch.Tensor:
    """Entropy of each row of a (possibly -inf-masked) log-probability table."""
    probs = log_probs.exp()
    return -(probs * log_probs.masked_fill(probs == 0, 0.0)).sum(-1)


class TurnLosses(NamedTuple):
    """Per-turn loss terms (shape (B,)) of :func:`turn_losses`; the trainer masks and normalises them."""

    policy: torch.Tensor  # L^CLIP_t
    kl: torch.Tensor | None  # KL_t to the reference policy (None without one)
    entropy: torch.Tensor  # H_t
    value: torch.Tensor | None  # L^V_t (None without a value head)
    ratio: torch.Tensor  # r_t (detached)
    clipped: torch.Tensor  # 1.0 where r_t left [1 - eps_low, 1 + eps_high]
    value_clipped: torch.Tensor | None  # 1.0 where the clipped value loss was the larger one


def clipped_surrogate(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) elementwise; also r (detached) and the clipped mask."""
    ratio = torch.exp(logp - old_logp)
    clipped_ratio = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    surrogate = -torch.min(ratio * advantages, clipped_ratio * advantages)
    out_of_range = ((ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)).float()
    return surrogate, ratio.detach(), out_of_range


def turn_losses(
    log_probs: torch.Tensor,
    option: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    ref_log_probs: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    old_values: torch.Tensor | None = None,
    returns: torch.Tensor | None = None,
    value_clip: float = 0.2,
) -> TurnLosses:
    """The per-turn terms of section 3 for one batch of turns: ``log_probs`` (B, L) is the policy's table over the
    offered options, ``option`` (B,) the chosen one, every other input has shape (B,) (``ref_log_probs``: (B, L))."""
    logp = log_probs.gather(-1, option[:, None]).squeeze(-1)
    policy, ratio, clipped = clipped_surrogate(logp, old_logp, advantages, clip_low, clip_high)
    kl = kl_over_options(log_probs, ref_log_probs) if ref_log_probs is not None else None
    value = value_clipped = None
    if values is not None:
        if old_values is None or returns is None:
            raise ValueError("turn_losses: a value loss needs old_values and returns")
        unclipped = (values - returns) ** 2
        v_clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
        clipped_loss = (v_clipped - returns) ** 2
        value = 0.5 * torch.maximum(unclipped, clipped_loss)  # L^V_t
        value_clipped = (clipped_loss > unclipped).float()
    return TurnLosses(policy, kl, entropy_from_log_probs(log_probs), value, ratio, clipped, value_clipped)


def window_mean(
    per_turn: torch.Tensor, mask: torch.Tensor, window_count: torch.Tensor, world: int
) -> torch.Tensor:
    """This micro-batch's share of the window mean ``1/N sum_t x_t``: ``W / N * sum_{t in mask} x_t``. Gradient
    accumulation adds the micro-batches and DDP averages the W processes, so the optimizer sees the mean over all N
    real turns of the window (N = ``window_count``, counted over every process)."""
    return (per_turn * mask).sum() * world / window_count.clamp(min=1.0)


# ------------------------------------------------------------------------------------ 4. the reflection's objective
class ReflectionLosses(NamedTuple):
    """Per-turn terms (shape (B,)) of :func:`reflection_token_losses`, each the mean over the turn's tokens."""

    policy: torch.Tensor  # L^R_t
    kl: torch.Tensor | None  # KL^R_t
    ratio: torch.Tensor  # mean token ratio (detached)
    clipped: torch.Tensor  # share of the turn's tokens whose ratio was clipped


def reflection_token_losses(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    token_mask: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    ref_logp: torch.Tensor | None = None,
) -> ReflectionLosses:
    """Section 4: ``logp`` / ``old_logp`` / ``ref_logp`` (B, T) are the log-probs of the reflection's generated tokens,
    ``token_mask`` (B, T) marks them, ``advantages`` (B,) is each turn's advantage."""
    mask = token_mask.float()
    n = mask.sum(-1).clamp(min=1.0)
    surrogate, ratio, clipped = clipped_surrogate(logp, old_logp, advantages[:, None], clip_low, clip_high)
    kl = None
    if ref_logp is not None:
        kl = (k3_kl(logp, ref_logp) * mask).sum(-1) / n
    return ReflectionLosses(
        (surrogate * mask).sum(-1) / n, kl, (ratio * mask).sum(-1) / n, (clipped * mask).sum(-1) / n
    )


#: ``reflection_reward`` values (section 4)
REFLECTION_REWARDS = ("advantage", "verified", "mixed")


def verified_reflection_rewards(
    named: Sequence[int | None], optimal: Sequence[Collection[int] | None], no_move_penalty: float
) -> list[float]:
    """v_t of section 4: 1 when the named move ``named[t]`` is among ``optimal[t]``, 0 when it names another move,
    ``-no_move_penalty`` when it names none. A turn whose optimal moves are unknown (None) is an error: ``verified``
    needs the environment's oracle at every state."""
    if len(named) != len(optimal):
        raise ValueError(f"{len(named)} named moves but {len(optimal)} optimal sets")
    rewards = []
    for t, (move, best) in enumerate(zip(named, optimal, strict=True)):
        if best is None:
            raise ValueError(
                f"turn {t}: the environment gave no optimal actions, which the verified reward needs"
            )
        rewards.append(-no_move_penalty if move is None else float(move in best))
    return rewards


def state_group_advantages(
    rewards: Sequence[float],
    group_ids: Sequence[int],
    state_keys: Sequence[Hashable],
    scale: str = "group",
    std_floor: float = 0.0,
) -> tuple[list[float], float]:
    """A^V_t of section 4 for one reward per turn (flat lists over the rollout's turns): centred (and scaled) over the
    turns of the same task group (``group_ids``) in the same state (``state_keys``); a turn alone in its state is
    centred and scaled over all turns of the rollout instead (the fallback). Returns the advantages and the share of
    turns that had a state group of two or more."""
    if not len(rewards) == len(group_ids) == len(state_keys):
        raise ValueError("rewards, group_ids and state_keys must have the same length")
    by_state: dict[tuple[int, Hashable], list[int]] = {}
    for t, (g, key) in enumerate(zip(group_ids, state_keys, strict=True)):
        by_state.setdefault((g, key), []).append(t)
    advantages = [0.0] * len(rewards)
    alone: list[int] = []
    for turns in by_state.values():
        if len(turns) == 1:
            alone.extend(turns)
            continue
        for t, a in zip(turns, _centre_and_scale([rewards[t] for t in turns], scale, std_floor), strict=True):
            advantages[t] = a
    if alone:  # fallback: the rollout's mean (and std) over every reflection
        mean = sum(rewards) / len(rewards)
        spread = 1.0
        if scale == "group" and len(rewards) > 1:
            std = (sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)) ** 0.5
            spread = max(std, std_floor) + 1e-6
        for t in alone:
            advantages[t] = (rewards[t] - mean) / spread
    grouped = len(rewards) - len(alone)
    return advantages, (grouped / len(rewards) if rewards else 0.0)


def reflection_advantages(
    mode: str, policy_advantages: Sequence[float], verified_advantages: Sequence[float] | None, weight: float
) -> list[float]:
    """A^R_t of section 4: the policy's (``advantage``), the verified one (``verified``), or (1 - w) A + w A^V."""
    if mode == "advantage":
        return list(policy_advantages)
    if verified_advantages is None or len(verified_advantages) != len(policy_advantages):
        raise ValueError(f"reflection_reward={mode!r} needs one verified advantage per turn")
    if mode == "verified":
        return list(verified_advantages)
    if mode == "mixed":
        return [
            (1 - weight) * a + weight * v for a, v in zip(policy_advantages, verified_advantages, strict=True)
        ]
    raise ValueError(f"unknown reflection_reward {mode!r}; choose one of {REFLECTION_REWARDS}")


def reflection_sft_losses(logp: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """L^S_t of section 4 (``reflection_objective: oracle_sft``): the mean negative log-likelihood of each turn's
    target tokens (``logp`` (B, T) their log-probs, ``token_mask`` (B, T) marks them); 0 for a row without tokens."""
    mask = token_mask.float()
    return -(logp * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


# ---------------------------------------------------------------------------------------------------- diagnostics
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
