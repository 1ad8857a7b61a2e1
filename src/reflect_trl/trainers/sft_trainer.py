"""``ReflectSFTTrainer``: stage 1 of Reflect-RL, the supervised warm-up of the policy or the reflection model.

TRL's ``SFTTrainer`` on the prompt/completion data of :mod:`reflect_trl.data.builder` (the loss covers the
completion only: the option label for the policy, the reflection + stop marker for the reflection model), plus

* checks of the data at init (:mod:`reflect_trl.trainers.sft_data`);
* an optional curriculum-ordered sampler (:mod:`reflect_trl.trainers.curriculum_sampler`: easy stages first);
* evaluation metrics beyond the loss on a bounded, evenly spread subset of the eval rows
  (:mod:`reflect_trl.trainers.sft_metrics`): ``eval_option_accuracy`` / ``eval_option_nll`` for the policy,
  ``eval_stop_rate`` / ``eval_reflection_length`` / ``eval_reflection_exact_match`` /
  ``eval_reflection_names_action`` (when the data has an ``action_text`` column) for the reflection model;
* the option labels recorded next to a saved policy (:data:`~reflect_trl.prompts.LABELS_FILE`), so RL and
  evaluation read the labels the policy was trained with;
* the Reflect-RL paper in the model card, W&B offline by default (:mod:`reflect_trl.tracking`).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset, IterableDataset
from trl import SFTConfig, SFTTrainer

from reflect_trl.batching import checkpointing_drops_cache, context_kv_cache, shared_prefix_length
from reflect_trl.data.io import DatasetFormatError
from reflect_trl.prompts import write_option_labels
from reflect_trl.reflection.model import ReflectionModel
from reflect_trl.tracking import configure_tracking
from reflect_trl.trainers.curriculum_sampler import CurriculumOrderedSampler, stage_order
from reflect_trl.trainers.paper import REFLECT_RL_PAPER
from reflect_trl.trainers.progress_callback import use_reflect_progress
from reflect_trl.trainers.sft_config import ReflectSFTConfig
from reflect_trl.trainers.sft_data import check_sft_dataset, count_options
from reflect_trl.trainers.sft_metrics import (
    policy_option_metrics,
    reflection_generation_metrics,
    spread_indices,
    strip_eos,
)

logger = logging.getLogger(__name__)


class ReflectSFTTrainer(SFTTrainer):
    """``SFTTrainer`` for the policy or the reflection model of Reflect-RL (see the module docstring).

    Takes the same arguments as ``trl.SFTTrainer``; ``args`` must be a :class:`ReflectSFTConfig` (a plain
    ``SFTConfig`` is converted with the Reflect-RL defaults).
    """

    _tag_names = ["trl", "sft", "reflect-trl"]
    _name = "ReflectSFT"
    _paper = REFLECT_RL_PAPER

    def __init__(
        self,
        model,
        args: ReflectSFTConfig | SFTConfig | None = None,
        data_collator=None,
        train_dataset: Dataset | IterableDataset | None = None,
        eval_dataset=None,
        processing_class=None,
        **kwargs,
    ) -> None:
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
            args = ReflectSFTConfig(output_dir=f"{str(name).rstrip('/').split('/')[-1]}-ReflectSFT")
        elif not isinstance(args, ReflectSFTConfig):
            values = {k: v for k, v in args.to_dict().items() if k in ReflectSFTConfig.__dataclass_fields__}
            values["hub_token"] = args.hub_token
            args = ReflectSFTConfig(**values)
        check_sft_dataset(train_dataset, "train_dataset", args.role, args.labels)
        check_sft_dataset(eval_dataset, "eval_dataset", args.role, args.labels)
        if args.curriculum_order:
            if not isinstance(train_dataset, Dataset):
                raise ValueError("curriculum_order needs a map-style datasets.Dataset as train_dataset")
            if "difficulty" not in train_dataset.column_names:
                raise DatasetFormatError(
                    "train_dataset: curriculum_order needs a 'difficulty' column; "
                    f"columns present: {train_dataset.column_names}"
                )
            difficulties = train_dataset["difficulty"]
            CurriculumOrderedSampler(difficulties, stage_order(difficulties, args.stages))  # fails early
        if isinstance(eval_dataset, dict):
            self._raw_eval_datasets = dict(eval_dataset)
        else:
            self._raw_eval_datasets = {"eval": eval_dataset} if eval_dataset is not None else {}
        self._raw_train_size = len(train_dataset) if isinstance(train_dataset, Dataset) else None
        self._card_train_dataset = train_dataset if isinstance(train_dataset, Dataset) else None
        configure_tracking(args.report_to, args.output_dir)
        super().__init__(
            model,
            args=args,
            data_collator=data_collator,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            **kwargs,
        )
        use_reflect_progress(self)  # bars on a terminal only; logs with numbers as numbers
        self._warn_dropped_rows()
        if args.curriculum_order:
            sampler = self._get_train_sampler()
            logger.info(
                "curriculum order: %s",
                {s: len(g) for s, g in zip(sampler.stages, sampler.groups, strict=True)},
            )

    # -- the loss ---------------------------------------------------------------------------------------------
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """SFTTrainer's loss on the rows' trained tails, their prompts encoded into a KV cache first
        (:meth:`_encode_prompt_context`). With ``return_outputs`` (logits for ``compute_metrics``) the plain batch."""
        if not return_outputs:
            inputs = self._encode_prompt_context(model, inputs)
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _encode_prompt_context(self, model, inputs: dict[str, Any]) -> dict[str, Any]:
        """``inputs`` cut to each row's tail — from the token that predicts the row's first trained label to its end —
        with everything before it encoded first into a KV cache, without the LM head: the rows' common leading tokens
        once at batch size 1, the rest of each row left-padded (:func:`~reflect_trl.batching.context_kv_cache`;
        gradients flow through the cache). TRL's fused LM head then runs on the tails only, with the positions and
        attention of the whole rows: the same loss, gradients and metrics up to float rounding, and on devices
        without Triton (where the fused head scores every position it is given) the head no longer scores the
        prompts. Returned unchanged when ``shared_prefix_min_tokens`` is 0 or a row has fewer context tokens, a row
        has no trained token, the batch is not right-padded with an attention mask (padding-free), or under
        activation checkpointing (the cache is dropped) or MoE router losses."""
        args = self.args
        ids, mask, labels = inputs.get("input_ids"), inputs.get("attention_mask"), inputs.get("labels")
        if (
            args.shared_prefix_min_tokens <= 0
            or ids is None
            or mask is None
            or labels is None
            or "position_ids" in inputs
            or "cache" in inputs
            or checkpointing_drops_cache(args, self.accelerator.unwrap_model(model))
            or getattr(self, "aux_loss_enabled", False)
        ):
            return inputs
        lengths = mask.sum(-1, keepdim=True)
        columns = torch.arange(ids.shape[1], device=ids.device)
        if not bool((mask.bool() == (columns[None, :] < lengths)).all()):
            return inputs  # not right-padded
        trained = labels != -100
        if not bool(trained.any(-1).all()):
            return inputs
        # row r's context: its first first_r - 1 tokens (column first_r - 1, which predicts the first label, is the tail's)
        context = trained.int().argmax(-1, keepdim=True) - 1
        if int(context.min()) < args.shared_prefix_min_tokens:
            return inputs
        rows = [row[:n].tolist() for row, n in zip(ids.cpu(), context.squeeze(-1).tolist(), strict=True)]
        prefix = shared_prefix_length(rows, args.shared_prefix_min_tokens)
        pad_id = getattr(self.data_collator, "pad_token_id", None) or 0
        cache, context_mask = context_kv_cache(model, rows, prefix, pad_id)
        # the tails, right-padded: column k of row r is the row's column context_r + k
        source = context + torch.arange(int((lengths - context).max()), device=ids.device)[None, :]
        real = source < lengths
        source = source.clamp(max=ids.shape[1] - 1)
        return {
            **inputs,
            "input_ids": ids.gather(1, source).masked_fill(~real, pad_id),
            "labels": labels.gather(1, source).masked_fill(~real, -100),
            "attention_mask": torch.cat([context_mask.to(mask.dtype), real.to(mask.dtype)], dim=1),
            "position_ids": source.masked_fill(~real, 0),
            "cache": cache,
        }

    # -- data ------------------------------------------------------------------------------------------------
    def _warn_dropped_rows(self) -> None:
        """TRL drops rows whose completion is cut away by ``max_length``; say so loudly."""
        if (
            self._raw_train_size is not None
            and isinstance(self.train_dataset, Dataset)
            and not self.args.packing
        ):
            dropped = self._raw_train_size - len(self.train_dataset)
            if dropped:
                logger.warning(
                    "%d of %d training rows were dropped because prompt + completion exceed max_length=%s; "
                    "raise max_length to keep them",
                    dropped,
                    self._raw_train_size,
                    self.args.max_length,
                )

    def _get_train_sampler(self, train_dataset: Dataset | None = None):
        if not self.args.curriculum_order:
            return super()._get_train_sampler(train_dataset)
        difficulties = self.train_dataset["difficulty"]  # the prepared data keeps its metadata columns
        if train_dataset is not None and len(train_dataset) != len(difficulties):
            raise RuntimeError("curriculum_order: the train data loader and train_dataset differ in length")
        return CurriculumOrderedSampler(
            difficulties, stage_order(difficulties, self.args.stages), seed=self.args.seed
        )

    # -- saving ----------------------------------------------------------------------------------------------
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save as ``SFTTrainer`` does; a policy also records its option labels next to the weights (checkpoints
        included)."""
        super().save_model(output_dir, _internal_call=_internal_call)
        if self.args.role == "policy" and self.args.should_save:
            write_option_labels(Path(output_dir or self.args.output_dir), self.args.labels)

    def create_model_card(
        self,
        model_name: str | None = None,
        dataset_name: str | None = None,
        tags: str | list[str] | None = None,
    ) -> None:
        """A Reflect-RL card (:mod:`reflect_trl.trainers.model_card`): base model, environment, role, paper, how to
        use the model, final metrics."""
        if not self.is_world_process_zero():
            return
        from reflect_trl.trainers.model_card import sft_card_facts, write_model_card

        write_model_card(sft_card_facts(self, model_name, dataset_name, tags), self.args.output_dir)

    # -- evaluation ------------------------------------------------------------------------------------------
    def evaluate(
        self, eval_dataset=None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval"
    ):
        if isinstance(eval_dataset, dict) or (eval_dataset is None and isinstance(self.eval_dataset, dict)):
            # Trainer.evaluate calls this method again once per named data set.
            return super().evaluate(
                eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix
            )
        if isinstance(eval_dataset, str):
            raw = self._raw_eval_datasets.get(eval_dataset)
        elif eval_dataset is None:
            raw = self._raw_eval_datasets.get("eval")
        else:
            raw = eval_dataset
            if isinstance(raw, Dataset) and "input_ids" not in raw.column_names:
                check_sft_dataset(raw, "eval_dataset", self.args.role, self.args.labels)
        extra = self.reflect_metrics(raw) if raw is not None else {}
        # SFTTrainer.log adds the "eval_" prefix to what sits in self._metrics["eval"].
        scope = metric_key_prefix.removeprefix("eval").lstrip("_")
        for key, value in extra.items():
            self._metrics["eval"][f"{scope}_{key}" if scope else key].append(value)
        metrics = super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
        metrics.update({f"{metric_key_prefix}_{k}": v for k, v in extra.items()})
        return metrics

    def reflection_model(self, model) -> ReflectionModel:
        """The model being trained as a :class:`ReflectionModel` (not frozen) with the eval generation settings."""
        args = self.args
        sharded = self.accelerator.num_processes > 1 and (self.is_deepspeed_enabled or self.is_fsdp_enabled)
        return ReflectionModel(
            model,
            self._tokenizer,
            max_new_tokens=args.reflection_max_new_tokens,
            temperature=1.0 if args.reflection_do_sample else 0.0,
            max_prompt_length=args.max_length,
            freeze=False,
            synced_gpus=sharded,
        )

    def reflect_metrics(self, dataset) -> dict[str, float]:
        """The role's extra metrics on a bounded subset of ``dataset`` (raw or prepared)."""
        if not isinstance(dataset, Dataset) or not {"prompt", "completion"} <= set(dataset.column_names):
            return {}
        args = self.args
        budget = args.eval_num_policy_samples if args.role == "policy" else args.eval_num_reflection_samples
        rows = spread_indices(len(dataset), budget)
        if not rows:
            return {}
        # Each process scores an equal-size shard (padded with zero-weight rows), then the sums are added.
        nproc, rank = self.accelerator.num_processes, self.accelerator.process_index
        per = math.ceil(len(rows) / nproc)
        shard = rows[rank * per : (rank + 1) * per]
        weights = [1.0] * len(shard) + [0.0] * (per - len(shard))
        shard = shard + [rows[0]] * (per - len(shard))
        subset = dataset.select(shard)
        eos = self._tokenizer.eos_token
        prompts = list(subset["prompt"])
        completions = [strip_eos(c, eos) for c in subset["completion"]]
        model = self.accelerator.unwrap_model(self.model)
        was_training = model.training
        model.eval()
        start = time.perf_counter()
        try:
            with self.autocast_smart_context_manager():
                if args.role == "policy":
                    labels = args.labels
                    offered = (
                        list(subset["num_options"])
                        if "num_options" in subset.column_names
                        else [count_options(p) for p in prompts]
                    )
                    sums = policy_option_metrics(
                        model,
                        self._tokenizer,
                        prompts,
                        [labels.index(c) for c in completions],
                        offered,
                        labels,
                        batch_size=args.per_device_eval_batch_size,
                        max_length=args.max_length,
                        weights=weights,
                    )
                else:
                    sums = reflection_generation_metrics(
                        self.reflection_model(model),
                        prompts,
                        completions,
                        batch_size=args.per_device_eval_batch_size,
                        weights=weights,
                        action_texts=list(subset["action_text"])
                        if "action_text" in subset.column_names
                        else None,
                    )
        finally:
            model.train(was_training)
        keys = sorted(sums)
        totals = torch.tensor([sums[k] for k in keys], dtype=torch.float64, device=self.accelerator.device)
        if nproc > 1:
            totals = self.accelerator.reduce(totals, reduction="sum")
        sums = dict(zip(keys, totals.tolist(), strict=True))
        count = max(sums["count"], 1.0)
        seconds = time.perf_counter() - start
        if args.role == "policy":
            return {
                "option_accuracy": sums["correct"] / count,
                "option_nll": sums["nll"] / count,
                "option_samples": sums["count"],
                "option_eval_seconds": seconds,
            }
        names_action = (
            {"reflection_names_action": sums["names_action"] / count}
            if "action_text" in subset.column_names
            else {}
        )
        return {
            "stop_rate": sums["stopped"] / count,
            "reflection_length": sums["length"] / count,
            "reflection_exact_match": sums["exact"] / count,
            **names_action,
            "reflection_samples": sums["count"],
            "reflection_eval_seconds": seconds,
        }


__all__ = ["ReflectSFTTrainer"]
