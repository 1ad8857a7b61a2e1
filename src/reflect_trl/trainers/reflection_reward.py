"""The reflection player's own reward (``ReflectPPOConfig.reflection_reward``), its on-policy supervision control
(``reflection_objective: oracle_sft``) and the rollout metrics of what the reflections name: a mixin of
``ReflectPPOTrainer``.

What the environment's oracle adds to a rollout: every turn's optimal moves (``TextEnv.optimal_actions``; the metrics
of every run with a reflection player, and the ``verified`` reward) and, for ``oracle_sft``, the oracle reflector's text
at every visited state. The math is ``rl_math`` section 4; this module turns episodes into the batch columns
``reflection_advantages`` / ``teacher_ids`` (:mod:`~reflect_trl.trainers.rl_batch`) and counts the oracle-labelled turns
a label-matched control reads (``reflection_labels.json``, :mod:`~reflect_trl.trainers.rl_state`).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from reflect_trl import rl_math
from reflect_trl.envs import Task, make_env
from reflect_trl.prompts import recommended_action, with_stop
from reflect_trl.rollout import Episode
from reflect_trl.trainers import rl_batch


class ReflectionRewardMixin:
    """Oracle checks at start-up, the reflection's advantages or oracle targets per turn, and their metrics."""

    def _setup_reflection_oracle(self, task: Task) -> None:
        """What this run asks of the environment's oracle, checked on one reset of ``task``."""
        probe = self._probe_env(task)
        self._records_optimal = self.reflection is not None and self._tells_optimal(probe)
        self._state_keys = self._has_state_keys(probe)
        self._teacher = None
        self._oracle_labels = 0  # oracle-labelled reflection turns trained on, all processes
        if self.reflection_learner is not None:
            self._check_reflection_oracle(probe)

    def _probe_env(self, task: Task):
        env = make_env(self.args.env_name, **(self.args.env_kwargs or {}))
        env.reset(task=task)
        return env

    @staticmethod
    def _tells_optimal(env) -> bool:
        try:
            env.optimal_actions()
        except (NotImplementedError, RuntimeError):
            return False
        return True

    @staticmethod
    def _has_state_keys(env) -> bool:
        try:
            env.state_key()
        except NotImplementedError:
            return False
        return True

    def _check_reflection_oracle(self, env) -> None:
        """``reflection_reward`` verified / mixed needs the environment's optimal moves, ``oracle_sft`` its oracle
        reflector: fail at start-up, naming the environment, when it has none."""
        args = self.args
        if args.reflection_objective == "oracle_sft":
            from reflect_trl.reflection import get_oracle_reflector

            try:
                self._teacher = get_oracle_reflector(args.env_name)
            except KeyError as err:
                raise ValueError(f"reflection_objective='oracle_sft': {err.args[0]}") from None
            if not self._tells_optimal(env):
                raise ValueError(
                    f"reflection_objective='oracle_sft' needs the oracle of environment {args.env_name!r} "
                    "(TextEnv.oracle_action): it has none"
                )
        elif args.reflection_reward != "advantage" and not self._tells_optimal(env):
            raise ValueError(
                f"reflection_reward={args.reflection_reward!r} rewards a reflection that names an optimal move, but "
                f"environment {args.env_name!r} cannot tell its optimal actions (TextEnv.optimal_actions / "
                "oracle_action raise NotImplementedError); use reflection_reward='advantage' "
                "(`reflect-trl check-env` reports whether an environment supports 'verified')"
            )

    def _with_reflection_targets(
        self, rows: list[rl_batch.TurnRow], episodes: list[Episode], advantages: list[float]
    ) -> list[rl_batch.TurnRow]:
        """``rows`` (one per turn, in episode order, with the policy's finalised ``advantages``) with what the
        reflection player learns from: its own advantage (``verified`` / ``mixed``) or the oracle's reflection
        (``oracle_sft``); logs the reflection metrics of every run that has them."""
        args = self.args
        verified = self._reflection_metrics(episodes)
        if self.reflection_learner is None:
            return rows
        turns = [t for ep in episodes for t in ep.turns]
        labelled = 0
        if args.reflection_objective == "oracle_sft":
            tokenizer = self.reflection_learner.tokenizer
            targets = [
                tokenizer(with_stop(t.teacher_reflection or ""), add_special_tokens=False)["input_ids"]
                if t.reflection_ids
                else []
                for t in turns
            ]
            rows = [replace(r, teacher_ids=tuple(ids)) for r, ids in zip(rows, targets, strict=True)]
            labelled = sum(1 for ids in targets if ids)
        elif args.reflection_reward != "advantage":
            keys = [t.state_key if self._state_keys else t.state_text for t in turns]
            groups = [ep.group for ep in episodes for _ in ep.turns]
            verified_adv, grouped = rl_math.state_group_advantages(
                verified, groups, keys, args.scale_rewards, args.scale_std_floor
            )
            self._metrics["train"]["reflection/verified_grouped_share"].append(grouped)
            mixed = rl_math.reflection_advantages(
                args.reflection_reward, advantages, verified_adv, args.reflection_verified_weight
            )
            rows = [replace(r, reflection_advantage=a) for r, a in zip(rows, mixed, strict=True)]
            labelled = sum(1 for t in turns if t.reflection_ids)
        if args.reflection_objective == "oracle_sft" or args.reflection_reward != "advantage":
            total = self.accelerator.reduce(
                torch.tensor(float(labelled), device=self.accelerator.device), "sum"
            )
            self._oracle_labels += int(total.item())
        return rows

    def _reflection_metrics(self, episodes: list[Episode]) -> list[float]:
        """Log what the rollout's reflections name (``reflection/optimal_named_share``: an optimal move,
        ``reflection/no_move_share``: none; over all processes) and how much they depend on the state
        (``reflection/distinct_per_state``: distinct reflections over distinct states, this process: a template
        collapse drives it towards 1 / states); return every turn's verified reward v_t (``rl_math`` section 4; empty
        where the rollout records no optimal moves)."""
        if not self._records_optimal:  # the same on every process: the collective below runs on all or none
            return []
        turns = [t for ep in episodes for t in ep.turns if t.reflection is not None]
        named = [recommended_action(t.reflection, t.actions) for t in turns]
        verified = rl_math.verified_reflection_rewards(
            named, [t.optimal_actions for t in turns], self.args.reflection_no_move_penalty
        )
        counts = torch.tensor(
            [
                float(
                    sum(m is not None and m in t.optimal_actions for m, t in zip(named, turns, strict=True))
                ),
                float(sum(m is None for m in named)),
                float(len(turns)),
            ],
            device=self.accelerator.device,
        )
        optimal, none, n = self.accelerator.reduce(counts, "sum").tolist()
        metrics = self._metrics["train"]
        metrics["reflection/optimal_named_share"].append(optimal / max(n, 1.0))
        metrics["reflection/no_move_share"].append(none / max(n, 1.0))
        # the state key where the rollout recorded one (gigpo, verified), else the observation text
        states = {t.state_key if t.state_key is not None else t.state_text for t in turns}
        metrics["reflection/distinct_per_state"].append(
            len({t.reflection for t in turns}) / max(len(states), 1)
        )
        # every turn of every episode, in row order (turns without a reflection: none here, every turn reads one)
        return verified

    def _reflection_sft_loss(self, inputs) -> torch.Tensor:
        """``reflection_objective: oracle_sft``: the oracle reflection's NLL (``rl_math`` section 4, L^S_t), a window
        mean over the turns with a target (no KL term: supervised towards the oracle, as the SFT warm-up)."""
        per_turn = self.reflection_learner.sft_losses(inputs)
        mask = inputs["turn_mask"] * (inputs["teacher_token_mask"].sum(-1) > 0).float()
        loss = rl_math.window_mean(per_turn, mask, inputs["window_turns"], self.accelerator.num_processes)
        self._log_means({"reflection/sft_nll": (per_turn.detach(), mask)})
        return loss


__all__ = ["ReflectionRewardMixin"]
