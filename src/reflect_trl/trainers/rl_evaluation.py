"""Evaluation during RL training, the TRL way: ``ReflectPPOTrainer.evaluate`` plays greedy held-out episodes.

TrainingArguments' own switches (``eval_strategy``, ``eval_steps``, ``eval_on_start``, ``load_best_model_at_end``,
``metric_for_best_model``) drive it. The episodes are the tasks and episode seeds that ``reflect-trl eval --split
<eval_split> --seed <eval_seed> --episodes_per_stage <eval_episodes_per_stage> --decodings greedy`` plays
(:func:`~reflect_trl.trainers.rl_tasks.eval_tasks_dataset`), in the evaluation environment (``eval_env_kwargs``, never
the training-only kwargs). An evaluation runs under a forked torch RNG and reads greedy reflections through a memo of
its own, so a run with evaluations trains exactly as one without.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from accelerate.utils import gather_object
from datasets import Dataset
from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl.models import unwrap_model_for_generation

from reflect_trl.envs import Task
from reflect_trl.reflection.cache import with_reflection_cache
from reflect_trl.rollout import Episode, PolicyActor, RolloutEngine


class GreedyEvaluationMixin:
    """``evaluate`` for :class:`~reflect_trl.trainers.rl_trainer.ReflectPPOTrainer` (uses its option head, reflection
    player factory and settings)."""

    _eval_engine: RolloutEngine | None = None

    def evaluate(
        self,
        eval_dataset: Dataset | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> dict[str, float]:
        """Greedy episodes on the evaluation tasks: the policy takes its argmax option and the reflection model
        decodes greedily. ``eval_dataset`` (default: the trainer's) has one row per episode (``task``,
        ``episode_seed``); the processes share its rows. Logs and returns ``<prefix>_success_rate`` (all episodes),
        ``<prefix>_<stage>_success_rate``, ``<prefix>_crash_rate``, ``<prefix>_episode_length`` and
        ``<prefix>_runtime``."""
        del ignore_keys  # no model outputs to drop: an evaluation is episodes, not a loss
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError(
                "evaluation needs evaluation tasks: pass eval_dataset (eval_tasks_dataset(args))"
            )
        if isinstance(dataset, str | dict):
            raise ValueError(
                "ReflectPPOTrainer evaluates one task set (a Dataset of eval_tasks_dataset rows)"
            )
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        rows = dataset.select(range(rank, len(dataset), world))
        tasks = [Task.from_dict(json.loads(t)) for t in rows["task"]]
        seeds = [int(x) for x in rows["episode_seed"]]
        start = time.perf_counter()
        devices = [self.accelerator.device] if self.accelerator.device.type == "cuda" else []
        with (
            torch.random.fork_rng(devices=devices),
            unwrap_model_for_generation(
                self.model_wrapped,
                self.accelerator,
                gather_deepspeed3_params=self.args.ds3_gather_for_generation,
            ) as unwrapped,
        ):
            was_training = unwrapped.training
            unwrapped.eval()
            engine = self._evaluation_engine(unwrapped)
            episodes: list[Episode] = []
            batch = max(self.args.per_device_eval_batch_size, 1)
            for i in range(0, len(tasks), batch):
                episodes.extend(engine.run(tasks[i : i + batch], seeds[i : i + batch]))
            unwrapped.train(was_training)
        outcomes = gather_object([(ep.task.difficulty, ep.success, ep.crashed, ep.length) for ep in episodes])
        n = max(len(outcomes), 1)
        metrics = {
            f"{metric_key_prefix}_success_rate": sum(o[1] for o in outcomes) / n,
            f"{metric_key_prefix}_crash_rate": sum(o[2] for o in outcomes) / n,
            f"{metric_key_prefix}_episode_length": sum(o[3] for o in outcomes) / n,
        }
        for stage in dict.fromkeys(o[0] for o in outcomes):
            wins = [o[1] for o in outcomes if o[0] == stage]
            metrics[f"{metric_key_prefix}_{stage}_success_rate"] = sum(wins) / len(wins)
        metrics[f"{metric_key_prefix}_runtime"] = round(time.perf_counter() - start, 4)
        # Trainer's log, not GRPOTrainer's: that one would add (and clear) the training rollouts' averaged metrics
        Trainer.log(self, metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        if self.args.load_best_model_at_end and self.state.global_step == 0 and self.state.max_steps > 0:
            self._start_competes_for_best(metrics)  # eval_on_start, inside train()
        return metrics

    def _start_competes_for_best(self, metrics: dict[str, float]) -> None:
        """With ``eval_on_start`` and ``load_best_model_at_end`` the policy before any update (the SFT checkpoint)
        competes for the best model too. Trainer leaves that evaluation out of its best-metric bookkeeping and only
        records checkpoints of steps > 0, so it would keep the last model even where RL made every one worse: the
        start enters the bookkeeping here and is saved as ``checkpoint-0``."""
        if self._determine_best_metric(metrics=metrics, trial=None):
            start = Path(self._get_output_dir(trial=None)) / f"{PREFIX_CHECKPOINT_DIR}-0"
            self.save_model(str(start), _internal_call=True)
            self.state.best_model_checkpoint = str(start)

    def _evaluation_engine(self, model) -> RolloutEngine:
        """Greedy policy, greedy reflections through a memo of their own (sharing the training memo would let an
        evaluation decide which reflections training reads from it), the evaluation environment."""
        actor = PolicyActor(
            model,
            self._tokenizer,
            self.option_head,
            1.0,
            greedy=True,
            shared_prefix_min_tokens=self.args.shared_prefix_min_tokens,
        )
        if self._eval_engine is None:
            reflection = None
            if self.reflection is not None:
                reflection = with_reflection_cache(
                    self._reflection_player(0.0), self.args.reflection_cache_size
                )
            self._eval_engine = RolloutEngine(
                self.args.env_name,
                actor,
                reflection,
                env_kwargs=self.args.evaluation_env_kwargs,
                shuffle_options=self.args.shuffle_options,
                max_prompt_length=self.args.max_prompt_length,
            )
        elif (
            self.reflection_learner is not None
        ):  # the reflection player changes: a fresh memo per evaluation
            self._eval_engine.reflection = with_reflection_cache(
                self._reflection_player(0.0), self.args.reflection_cache_size
            )
        self._eval_engine.policy = actor
        return self._eval_engine


__all__ = ["GreedyEvaluationMixin"]
