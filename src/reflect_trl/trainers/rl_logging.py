"""What ``ReflectPPOTrainer`` logs: episode outcomes and curriculum per rollout, the loss terms' means over the real
turns of all processes, the memos' hit rates, and sample episodes (JSONL, and a wandb table)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object

from reflect_trl import rl_math
from reflect_trl.action_head import OptionForward
from reflect_trl.reflection.cache import CachedReflectionPlayer
from reflect_trl.rollout import Episode, episode_metrics

logger = logging.getLogger(__name__)

NO_SIGNAL_PATIENCE = 3  # consecutive rollouts (or logged optimizer steps) without signal before the warning
NO_SIGNAL_MIN_ROLLOUTS = 2  # ... or, in a stage, at least this many rollouts without signal
NO_SIGNAL_SHARE = 0.5  # ... making up at least this share of the stage's rollouts so far
NO_SUCCESS_PATIENCE = 5  # consecutive rollouts without a successful episode before the warning

NO_SIGNAL_LEVERS = (
    "Levers: more episodes per task (num_generations), explore more (temperature), an easier stage or a stronger "
    "SFT start. Sampled reflections (reflection_temperature > 0) vary the groups too, but collapsed the greedy policy "
    "on 3 of 5 DangerousTaxi seeds (docs/experiments.md §1.1)."
)


@dataclass
class NoSignalMonitor:
    """Counts the rollouts without a learning signal per curriculum stage and warns once per stage.

    A rollout has no learning signal when every turn of its batch (the episodes' turns and the replayed ones, on all
    processes) has a zero advantage (``|A| <= rl_math.ZERO_ADVANTAGE_TOL``): exactly the rollouts whose optimizer
    steps ``skip_no_signal_steps`` skips. Identical returns in every task group are not the rule (with ``gamma`` < 1,
    ``gae`` or ``reinforce`` such turns can still carry advantage): they are the metric
    ``signal/identical_return_group_share``.

    The signal warning is due, once per stage, when

    * at least ``min_rollouts`` of the stage's rollouts so far, and at least ``share`` of them, had no signal (a stage
      of 2 rollouts reaches it with 2 of 2), or
    * ``patience`` rollouts in a row had none (a long stage whose signal dies late), or
    * ``patience`` logged steps in a row had a zero gradient norm.

    Separately, a warning when ``success_patience`` rollouts in a row had no successful episode (RL then learns from
    failures only: docs/experiments.md §1.4a, §1.4e). :meth:`summary` is the end-of-run line over all stages."""

    patience: int = NO_SIGNAL_PATIENCE
    success_patience: int = NO_SUCCESS_PATIENCE
    min_rollouts: int = NO_SIGNAL_MIN_ROLLOUTS
    share: float = NO_SIGNAL_SHARE
    streaks: dict[str, int] = field(default_factory=lambda: {"rollout": 0, "grad_norm": 0, "success": 0})
    warned: set[tuple[str, str]] = field(default_factory=set)  # (stage, "signal" | "success")
    stage: str | None = None
    #: per stage, in the order first seen: [rollouts without signal, rollouts]
    rollouts: dict[str, list[int]] = field(default_factory=dict)

    def update(self, stage: str, kind: str, no_signal: bool) -> str | None:
        """Record one observation of ``kind`` ("rollout", "grad_norm": no learning signal; "success": no successful
        episode); the warning text when it is due. A new stage starts new streaks."""
        if stage != self.stage:
            self.stage, self.streaks = stage, {k: 0 for k in self.streaks}
        self.streaks[kind] = self.streaks[kind] + 1 if no_signal else 0
        if kind == "rollout":
            counts = self.rollouts.setdefault(stage, [0, 0])
            counts[0] += int(no_signal)
            counts[1] += 1
        success = kind == "success"
        topic = "success" if success else "signal"  # "rollout" and "grad_norm" share one warning per stage
        if (stage, topic) in self.warned or not self._due(stage, kind):
            return None
        self.warned.add((stage, topic))
        streak = self.streaks[kind]
        if success:
            return (
                f"No episode succeeded in curriculum stage {stage!r} for {streak} rollouts in a row: RL "
                "now learns from failures only (e.g. to fail later). A stage that stays success-free can collapse "
                "the greedy policy (docs/experiments.md §1.4a, §1.4e); shorter streaks also occur in runs that "
                "recover. Levers: an easier stage, a stronger SFT start, more episodes per task (num_generations)."
            )
        if kind == "grad_norm":
            what = f"the gradient norm was 0 for {streak} logged steps in a row"
        else:
            k, n = self.rollouts[stage]
            what = (
                f"{k} of its {n} rollouts so far had a zero advantage on every turn (every task group's episodes "
                "ended alike); skip_no_signal_steps skips their optimizer steps, else the KL term alone moves the "
                "policy"
            )
        return f"RL has no learning signal in curriculum stage {stage!r}: {what}. {NO_SIGNAL_LEVERS}"

    def _due(self, stage: str, kind: str) -> bool:
        streak = self.streaks[kind]
        if kind == "success":
            return streak >= self.success_patience
        if kind == "rollout":
            k, n = self.rollouts[stage]
            if k >= self.min_rollouts and k >= self.share * n:
                return True
        return streak >= self.patience

    @property
    def no_signal_rollouts(self) -> int:
        return sum(k for k, _ in self.rollouts.values())

    def summary(self) -> str | None:
        """The line "k of n rollouts had no learning signal (zero advantage on every turn)" with the count of every
        stage; None before any rollout."""
        if not self.rollouts:
            return None
        n = sum(n for _, n in self.rollouts.values())
        stages = ", ".join(f"{stage!r} {k} of {n}" for stage, (k, n) in self.rollouts.items())
        return (
            f"{self.no_signal_rollouts} of {n} rollouts had no learning signal (zero advantage on every turn); per "
            f"curriculum stage: {stages}"
        )


def signal_shares(
    returns: list[float], groups: list[int], advantages: list[float]
) -> tuple[float, float, float]:
    """(groups with identical returns, groups with more than one episode, turns with a zero advantage): the counts
    behind ``signal/identical_return_group_share`` and ``signal/zero_advantage_turn_share``."""
    by_group: dict[int, list[float]] = {}
    for g, r in zip(groups, returns, strict=True):
        by_group.setdefault(g, []).append(r)
    compared = [rs for rs in by_group.values() if len(rs) > 1]
    identical = sum(max(rs) - min(rs) <= rl_math.ZERO_ADVANTAGE_TOL for rs in compared)
    zero = sum(abs(a) <= rl_math.ZERO_ADVANTAGE_TOL for a in advantages)
    return float(identical), float(len(compared)), float(zero)


class RolloutLoggingMixin:
    """Metrics of ``ReflectPPOTrainer`` (a mixin of its hooks): rollouts, loss terms, memos, episode tables."""

    # --------------------------------------------------------------------------------------------- logging
    def _log_loss_metrics(
        self, inputs: dict[str, Any], scores: OptionForward, terms: rl_math.TurnLosses, values
    ) -> None:
        """Means over the real turns of the micro-batch on all processes (one collective)."""
        mask, value_mask = inputs["turn_mask"], inputs["value_mask"] * inputs["turn_mask"]
        logp = scores.log_probs.gather(-1, inputs["option"][:, None]).squeeze(-1)
        columns = {
            "policy_loss": (terms.policy, mask),
            "entropy": (terms.entropy, mask),
            "approx_kl": (rl_math.approx_kl(logp, inputs["old_logps"]), mask),
            "clip_fraction": (terms.clipped, mask),
            "ratio_mean": (terms.ratio, mask),
        }
        if terms.kl is not None:
            columns["kl"] = (terms.kl, mask)
        if terms.value is not None:
            columns["value_loss"] = (terms.value, value_mask)
            columns["value_clipfrac"] = (terms.value_clipped, value_mask)
        self._log_means(columns)
        metrics = self._metrics["train"]
        if values is not None:
            # explained variance over the value turns of all processes, from global sums (ranks hold different counts)
            r, d = inputs["returns"], inputs["returns"] - values.detach()
            moments = torch.stack(
                [value_mask.sum(), (r * value_mask).sum(), (r * r * value_mask).sum()]
                + [(d * value_mask).sum(), (d * d * value_mask).sum()]
            )
            n, r1, r2, d1, d2 = self.accelerator.reduce(moments, reduction="sum").tolist()
            metrics["explained_variance"].append(rl_math.explained_variance_from_moments(n, r1, r2, d1, d2))
        if scores.aux_loss is not None:
            metrics["aux_loss"].append(self.accelerator.gather(scores.aux_loss.detach()).mean().item())
        metrics["curriculum/stage"].append(float(inputs["stage_index"]))

    def _log_means(self, columns: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Log each column's mean over its mask's rows on all processes (one collective)."""
        sums = torch.stack(
            [torch.stack([(v.detach().float() * m).sum(), m.sum()]) for v, m in columns.values()]
        )
        sums = self.accelerator.reduce(sums, reduction="sum")
        for name, (total, count) in zip(columns, sums.tolist(), strict=True):
            if count > 0:
                self._metrics["train"][name].append(total / count)

    def _log_signal(
        self, stage: str, episodes: list[Episode], advantages: list[float], replayed: list[float] = ()
    ) -> None:
        """Log how much of the rollout carries a learning signal (over all processes): ``advantages`` are those of the
        episodes' turns (the shares), ``replayed`` those of the replayed turns (which count for the no-signal rule,
        as for ``skip_no_signal_steps``). Warn when rollouts have none, and when no episode succeeds for a while."""
        identical, compared, zero = signal_shares(
            [ep.total_return for ep in episodes], [ep.group for ep in episodes], advantages
        )
        # the turns with a non-zero advantage, counted as the loss's window counts do (float32, rl_batch.window_counts)
        carried = int((torch.tensor([*advantages, *replayed]).abs() > rl_math.ZERO_ADVANTAGE_TOL).sum())
        successes = float(sum(ep.success for ep in episodes))
        counts = [identical, compared, zero, float(len(advantages)), successes, float(len(episodes)), carried]
        counts = torch.tensor(counts, dtype=torch.float32, device=self.accelerator.device)
        identical, compared, zero, turns, successes, played, carried = self.accelerator.reduce(
            counts, reduction="sum"
        ).tolist()
        metrics = self._metrics["train"]
        if compared > 0:
            metrics["signal/identical_return_group_share"].append(identical / compared)
        if turns > 0:
            metrics["signal/zero_advantage_turn_share"].append(zero / turns)
        self._warn_no_signal(stage, "rollout", carried == 0)
        if played > 0:
            self._warn_no_signal(stage, "success", successes == 0)

    def _warn_no_signal(self, stage: str, kind: str, no_signal: bool) -> None:
        message = self._no_signal.update(stage, kind, no_signal)
        if message is not None and self.accelerator.is_main_process:
            logger.warning(message)

    def train(self, *args: Any, **kwargs: Any):
        """Trainer's ``train``, then one line on the main process: how many of the rollouts this trainer played had no
        learning signal, per curriculum stage (a warning when any had none; a resumed run counts from the resume)."""
        output = super().train(*args, **kwargs)
        line = self._no_signal.summary()
        if line is not None and self.accelerator.is_main_process:
            (logger.warning if self._no_signal.no_signal_rollouts else logger.info)(line)
        return output

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's logging, watching the gradient norm for the no-signal warning."""
        if "grad_norm" in logs and self.args.train_policy:
            self._warn_no_signal(self.curriculum.stage, "grad_norm", float(logs["grad_norm"]) == 0.0)
        super().log(logs, start_time)

    def _memo_hit_rate(self, name: str, memo) -> float:
        """The share of this rollout's look-ups of ``memo`` that it answered."""
        hits, lookups = self._memo_counts[name]
        self._memo_counts[name] = (memo.hits, memo.lookups)
        return (memo.hits - hits) / max(memo.lookups - lookups, 1)

    def _log_rollout(self, stage: str, episodes: list[Episode], seconds: float, n_samples: int) -> None:
        """Gather episode outcomes from all processes, log metrics, update the success-schedule curriculum."""
        everything = gather_object([(ep.success, ep.total_return, ep.length, ep.crashed) for ep in episodes])
        metrics = self._metrics["train"]
        n = max(len(everything), 1)
        for k, name in enumerate(("success_rate", "return", "episode_length", "crash_rate")):
            metrics[f"env/{name}"].append(sum(x[k] for x in everything) / n)
        metrics[f"stage/{stage}/success_rate"].append(sum(x[0] for x in everything) / n)
        stats = episode_metrics(episodes)
        for key in ("reflection_tokens", "reflection_stop_rate", "policy_entropy"):
            if key in stats:
                metrics[f"rollout/{key}"].append(stats[key])
        if isinstance(self.reflection, CachedReflectionPlayer):
            metrics["rollout/reflection_cache_hit_rate"].append(
                self._memo_hit_rate("reflection", self.reflection)
            )
        if self.ref_memo is not None:
            metrics["rollout/ref_memo_hit_rate"].append(self._memo_hit_rate("ref", self.ref_memo))
        metrics["rollout/seconds"].append(seconds)
        metrics["rollout/turn_samples"].append(float(n_samples))
        if self.args.replay_buffer_size > 0:
            metrics["replay/size"].append(float(len(self.replay)))
        if self.curriculum.schedule == "success":
            self._advance_curriculum([x[0] for x in everything])
        if self.args.log_episodes_every and self._rollouts % self.args.log_episodes_every == 0:
            self._log_episode_table(episodes[: self.args.num_logged_episodes])

    def _log_episode_table(self, episodes: list[Episode]) -> None:
        if not self.accelerator.is_main_process:
            return
        path = Path(self.args.output_dir) / "episodes"
        path.mkdir(parents=True, exist_ok=True)
        with open(path / f"step_{self.state.global_step:06d}.jsonl", "w") as f:
            for ep in episodes:
                f.write(json.dumps(ep.transcript()) + "\n")
        if self.args.report_to and "wandb" in self.args.report_to:
            import wandb

            if wandb.run is not None:
                rows = [
                    [
                        self.state.global_step,
                        e,
                        t.step,
                        t.state_text,
                        t.reflection or "",
                        t.action_text,
                        t.reward,
                    ]
                    for e, ep in enumerate(episodes)
                    for t in ep.turns
                ]
                columns = ["step", "episode", "turn", "state", "reflection", "action", "reward"]
                wandb.log({"episodes": wandb.Table(columns=columns, data=rows)}, commit=False)
