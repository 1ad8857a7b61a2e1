"""Stage 1 of Reflect-RL: supervised warm-up of the policy and of the reflection model (``ReflectSFTTrainer``).

``ReflectSFTTrainer`` is TRL's ``SFTTrainer`` on the prompt/completion data of :mod:`reflect_trl.data_builder`
(so the loss covers the completion only: the option label for the policy, the reflection + stop marker for
the reflection model), plus

* checks of the data at init (required columns, non-empty fields, completions that fit the ``role``);
* an optional curriculum-ordered sampler (:class:`CurriculumOrderedSampler`: easy stages first);
* evaluation metrics beyond the loss, computed on a bounded, evenly spread subset of the eval rows:
  ``role="policy"``: ``eval_option_accuracy`` (argmax of the option-restricted head over the offered options
  against the oracle label) and ``eval_option_nll``; ``role="reflection"``: ``eval_stop_rate`` (generated
  reflections that emit the stop marker within ``reflection_max_new_tokens``), ``eval_reflection_length``
  (mean generated tokens), ``eval_reflection_exact_match`` and, when the data has an ``action_text`` column,
  ``eval_reflection_names_action`` (generated reflections that name the oracle's next action: a proxy for
  whether the reflection plans the right move);
* W&B offline by default (:mod:`reflect_trl.tracking`).

:func:`run_sft` is the entry point of ``reflect-trl sft`` (also under ``accelerate launch``).
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset, IterableDataset
from torch.utils.data import Sampler
from trl import SFTConfig, SFTTrainer

from reflect_trl.action_head import OptionHead, masked_log_probs
from reflect_trl.datasets_io import REQUIRED_COLUMNS, DatasetFormatError, validate_dataset
from reflect_trl.prompts import (
    ACTION_CUE,
    DEFAULT_LABELS,
    OPTIONS_HEADER,
    REFLECTION_HEADER,
    STOP_MARKER,
    clean_reflection,
    encode_prompts,
)
from reflect_trl.reflection.model import left_pad
from reflect_trl.tracking import configure_tracking

logger = logging.getLogger(__name__)

ROLES = ("policy", "reflection")


# -- configuration -------------------------------------------------------------------------------------------
@dataclass
class ReflectSFTConfig(SFTConfig):
    """``SFTConfig`` plus the Reflect-RL options.

    Defaults that differ from TRL's, so that the same recipe runs on a laptop CPU and on a GPU:
    ``bf16`` None -> True only on a CUDA device that supports it (TRL: True everywhere, which fails on CPU);
    ``activation_checkpointing`` (alias ``gradient_checkpointing``) None -> True only on CUDA (it only costs
    time on CPU-sized models).
    """

    role: str = field(
        default="policy",
        metadata={
            "help": "What is trained: 'policy' (completion = option label) or 'reflection'.",
            "choices": ROLES,
        },
    )
    curriculum_order: bool = field(
        default=False,
        metadata={"help": "Order each epoch by stage, easy first (needs a 'difficulty' column)."},
    )
    stages: list[str] | None = field(
        default=None,
        metadata={
            "help": "Stage order for curriculum_order (default: order of first appearance in the data)."
        },
    )
    option_labels: str | None = field(
        default=None, metadata={"help": "Option labels as one string, e.g. ABCDEF (default: A-Z, a-z, 0-9)."}
    )
    eval_num_policy_samples: int = field(
        default=256, metadata={"help": "Eval rows scored for eval_option_accuracy (0 = off)."}
    )
    eval_num_reflection_samples: int = field(
        default=32, metadata={"help": "Eval rows whose reflection is generated for eval_stop_rate (0 = off)."}
    )
    reflection_max_new_tokens: int = field(
        default=64, metadata={"help": "Token budget of a generated reflection."}
    )
    reflection_do_sample: bool = field(
        default=False, metadata={"help": "Sample eval reflections (default: greedy decoding)."}
    )
    gradient_checkpointing: bool | None = field(
        default=None, metadata={"help": "Deprecated alias of activation_checkpointing (transformers 5.24)."}
    )
    warmup_ratio: float | None = field(
        default=None,
        metadata={
            "help": "Warm-up as a fraction of the steps (transformers 5 folded it into warmup_steps < 1)."
        },
    )

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        on_cuda = torch.cuda.is_available() and not self.use_cpu
        if self.bf16 is None and not self.fp16:
            self.bf16 = bool(on_cuda and torch.cuda.is_bf16_supported())
        if self.activation_checkpointing is None and self.gradient_checkpointing is None:
            self.activation_checkpointing = on_cuda
        if self.warmup_ratio is not None:
            if not 0.0 <= self.warmup_ratio < 1.0:
                raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
            if self.warmup_steps:
                raise ValueError("set either warmup_steps or warmup_ratio, not both")
            self.warmup_steps = self.warmup_ratio
        if self.reflection_max_new_tokens < 1:
            raise ValueError(f"reflection_max_new_tokens must be >= 1, got {self.reflection_max_new_tokens}")
        if self.option_labels is not None and len(set(self.option_labels)) != len(self.option_labels):
            raise ValueError(f"option_labels must be distinct characters, got {self.option_labels!r}")
        super().__post_init__()

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(self.option_labels) if self.option_labels else DEFAULT_LABELS


# -- curriculum-ordered sampling -----------------------------------------------------------------------------
class CurriculumOrderedSampler(Sampler[int]):
    """Yields the rows of each stage in turn (``stages`` easy to hard), shuffled within a stage with a seed
    that changes with :meth:`set_epoch`. Every epoch repeats the curriculum."""

    def __init__(self, difficulties: Sequence[str], stages: Sequence[str], seed: int = 0) -> None:
        unknown = sorted(set(difficulties) - set(stages))
        if unknown:
            raise ValueError(
                f"curriculum_order: difficulty value(s) {unknown} are not among the stages {list(stages)}; "
                "set `stages` to every difficulty in the data, easy to hard"
            )
        self.stages = list(stages)
        self.groups = [[i for i, d in enumerate(difficulties) if d == stage] for stage in self.stages]
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return sum(len(g) for g in self.groups)

    def __iter__(self) -> Iterator[int]:
        rng = random.Random(f"{self.seed}/{self.epoch}")
        for group in self.groups:
            order = list(group)
            rng.shuffle(order)
            yield from order


def stage_order(difficulties: Sequence[str], stages: Sequence[str] | None) -> list[str]:
    """``stages`` if given, else the difficulties in order of first appearance."""
    return list(stages) if stages else list(dict.fromkeys(difficulties))


# -- data checks ---------------------------------------------------------------------------------------------
def count_options(prompt: str) -> int:
    """Number of options listed in a policy prompt's options block (0 if it has none)."""
    if OPTIONS_HEADER not in prompt or not prompt.endswith(ACTION_CUE):
        return 0
    block = prompt.rsplit(OPTIONS_HEADER, 1)[1][: -len(ACTION_CUE)]
    return len([line for line in block.split("\n") if line])


def check_role_data(dataset: Dataset, source: str, role: str, labels: Sequence[str]) -> None:
    """Raise :class:`DatasetFormatError` naming the row unless every row fits ``role``."""
    prompts, completions = dataset["prompt"], dataset["completion"]
    num_options = dataset["num_options"] if "num_options" in dataset.column_names else None
    for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        if role == "policy":
            if completion not in labels:
                hint = (
                    " (it looks like reflection data: set role='reflection')"
                    if STOP_MARKER in completion
                    else ""
                )
                raise DatasetFormatError(
                    f"{source}, row {row}: policy completion {completion[:40]!r} is not an option label "
                    f"{''.join(labels[:8])}...{hint}"
                )
            if not prompt.endswith(ACTION_CUE):
                raise DatasetFormatError(
                    f"{source}, row {row}: a policy prompt must end with the action cue {ACTION_CUE!r} "
                    f"(from reflect_trl.prompts.build_prompt); it ends with {prompt[-40:]!r}"
                )
            offered = num_options[row] if num_options is not None else count_options(prompt)
            if labels.index(completion) >= offered:
                raise DatasetFormatError(
                    f"{source}, row {row}: label {completion!r} is beyond the {offered} offered option(s)"
                )
        else:
            if not completion.endswith(STOP_MARKER):
                raise DatasetFormatError(
                    f"{source}, row {row}: a reflection completion must end with the stop marker {STOP_MARKER!r} "
                    f"(reflect_trl.prompts.with_stop); it ends with {completion[-40:]!r}"
                    + (" (it looks like policy data: set role='policy')" if completion in labels else "")
                )
            if not prompt.endswith(REFLECTION_HEADER):
                raise DatasetFormatError(
                    f"{source}, row {row}: a reflection prompt must end with {REFLECTION_HEADER!r} "
                    "(reflect_trl.prompts.reflection_prompt)"
                )


def _check_dataset(dataset: Any, source: str, args: ReflectSFTConfig) -> None:
    if dataset is None:
        return
    if isinstance(dataset, dict):
        for name, part in dataset.items():
            _check_dataset(part, f"{source}[{name!r}]", args)
        return
    if isinstance(dataset, IterableDataset):
        first = next(iter(dataset), None)
        if first is None:
            raise DatasetFormatError(f"{source}: the data set is empty")
        missing = [c for c in REQUIRED_COLUMNS if c not in first]
        if missing and "input_ids" not in first:
            raise DatasetFormatError(
                f"{source}: missing column(s) {missing}; columns present: {sorted(first)}"
            )
        return
    if not isinstance(dataset, Dataset):
        raise TypeError(f"{source} must be a datasets.Dataset, got {type(dataset).__name__}")
    if len(dataset) == 0:
        raise DatasetFormatError(f"{source}: the data set is empty")
    if "input_ids" in dataset.column_names and "prompt" not in dataset.column_names:
        return  # pre-tokenized: TRL uses it as is
    validate_dataset(dataset, source)
    check_role_data(dataset, source, args.role, args.labels)


# -- evaluation helpers --------------------------------------------------------------------------------------
def spread_indices(n: int, k: int) -> list[int]:
    """``min(n, k)`` distinct row indices spread evenly over ``range(n)`` (deterministic)."""
    if k <= 0 or n <= 0:
        return []
    if k >= n:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)}) if k > 1 else [0]


def _strip_eos(text: str, eos: str | None) -> str:
    return text[: -len(eos)] if eos and text.endswith(eos) else text


def _tokenize_prompts(tokenizer, prompts: Sequence[str], max_length: int | None) -> list[list[int]]:
    """Token ids as TRL's SFT tokenizes a prompt (``tokenizer(text=...)``), keeping the end if too long."""
    ids = encode_prompts(tokenizer, prompts)
    if max_length:
        ids = [x[-max_length:] for x in ids]
    return ids


@torch.no_grad()
def policy_option_metrics(
    model,
    tokenizer,
    prompts: Sequence[str],
    target_options: Sequence[int],
    num_options: Sequence[int],
    labels: Sequence[str] = DEFAULT_LABELS,
    batch_size: int = 16,
    max_length: int | None = None,
    weights: Sequence[float] | None = None,
) -> dict[str, float]:
    """Option accuracy (argmax over the offered options of the option-restricted head) and mean NLL of the
    target option; returned as weighted sums ``correct``, ``nll``, ``count`` so shards can be added."""
    weights = list(weights) if weights is not None else [1.0] * len(prompts)
    if not prompts:
        return {"correct": 0.0, "nll": 0.0, "count": 0.0}
    head = OptionHead(tokenizer, labels[: max(num_options)])
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    correct = nll = count = 0.0
    for start in range(0, len(prompts), batch_size):
        stop = start + batch_size
        input_ids, mask = left_pad(_tokenize_prompts(tokenizer, prompts[start:stop], max_length), pad_id)
        input_ids, mask = input_ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        offered = torch.tensor(num_options[start:stop], device=device)
        label_logits = head.label_logits(model, input_ids, mask, position_ids=positions)
        log_probs = masked_log_probs(label_logits, offered)
        target = torch.tensor(target_options[start:stop], device=device)
        weight = torch.tensor(weights[start:stop], device=device, dtype=torch.float)
        correct += float(((log_probs.argmax(-1) == target).float() * weight).sum())
        nll += float((-log_probs.gather(1, target[:, None]).squeeze(1) * weight).sum())
        count += float(weight.sum())
    return {"correct": correct, "nll": nll, "count": count}


def _stop_position(tokenizer, tokens: Sequence[int], marker_ids: Sequence[int]) -> tuple[int, bool]:
    """(generated length, emitted the stop marker?): the length counts tokens up to and including the marker,
    else up to and including an EOS, else all of them (generation pads after it stops)."""
    eos = tokenizer.eos_token_id
    for k, token in enumerate(tokens, start=1):
        if len(marker_ids) == 1:
            if token == marker_ids[0]:
                return k, True
        elif STOP_MARKER in tokenizer.decode(tokens[:k], skip_special_tokens=False):
            return k, True
        if token == eos:
            return k, False
    return len(tokens), False


@torch.no_grad()
def reflection_generation_metrics(
    model,
    tokenizer,
    prompts: Sequence[str],
    references: Sequence[str],
    max_new_tokens: int = 64,
    batch_size: int = 16,
    do_sample: bool = False,
    max_length: int | None = None,
    weights: Sequence[float] | None = None,
    synced_gpus: bool = False,
    action_texts: Sequence[str] | None = None,
) -> dict[str, float]:
    """Generate reflections and count those that emit :data:`STOP_MARKER` within ``max_new_tokens``; also the
    generated length (tokens up to and including the marker, or all of them), exact matches with the reference
    (both cut at the marker) and, given ``action_texts`` (the oracle action of each row), reflections that name
    that action. Weighted sums ``stopped``, ``length``, ``exact``, ``names_action``, ``count``."""
    weights = list(weights) if weights is not None else [1.0] * len(prompts)
    totals = {"stopped": 0.0, "length": 0.0, "exact": 0.0, "names_action": 0.0, "count": 0.0}
    if not prompts:
        return totals
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    marker_ids = tokenizer(STOP_MARKER, add_special_tokens=False)["input_ids"]
    stop_kwargs: dict[str, Any]
    if len(marker_ids) == 1:
        eos = [marker_ids[0]] + ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
        stop_kwargs = {"eos_token_id": eos}
    else:
        stop_kwargs = {"stop_strings": [STOP_MARKER], "tokenizer": tokenizer}
    for start in range(0, len(prompts), batch_size):
        stop = start + batch_size
        input_ids, mask = left_pad(_tokenize_prompts(tokenizer, prompts[start:stop], max_length), pad_id)
        output = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=mask.to(device),
            max_new_tokens=max_new_tokens,
            do_sample=do_sample,
            pad_token_id=pad_id,
            synced_gpus=synced_gpus,
            **stop_kwargs,
        )
        new_tokens = output[:, input_ids.shape[1] :].tolist()
        for i, tokens in enumerate(new_tokens):
            weight = weights[start + i]
            length, stopped = _stop_position(tokenizer, tokens, marker_ids)
            text = tokenizer.decode(tokens[:length], skip_special_tokens=False)
            exact = stopped and clean_reflection(text) == clean_reflection(references[start + i])
            if action_texts is not None:
                totals["names_action"] += weight * (action_texts[start + i] in clean_reflection(text))
            totals["stopped"] += weight * stopped
            totals["length"] += weight * length
            totals["exact"] += weight * exact
            totals["count"] += weight
    return totals


# -- trainer -------------------------------------------------------------------------------------------------
class ReflectSFTTrainer(SFTTrainer):
    """``SFTTrainer`` for the policy or the reflection model of Reflect-RL (see the module docstring).

    Takes the same arguments as ``trl.SFTTrainer``; ``args`` must be a :class:`ReflectSFTConfig` (a plain
    ``SFTConfig`` is converted with the Reflect-RL defaults).
    """

    _tag_names = ["trl", "sft", "reflect-trl"]
    _name = "ReflectSFT"

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
        _check_dataset(train_dataset, "train_dataset", args)
        _check_dataset(eval_dataset, "eval_dataset", args)
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
        self._warn_dropped_rows()
        if args.curriculum_order:
            sampler = self._get_train_sampler()
            logger.info(
                "curriculum order: %s",
                {s: len(g) for s, g in zip(sampler.stages, sampler.groups, strict=True)},
            )

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
                _check_dataset(raw, "eval_dataset", self.args)
        extra = self.reflect_metrics(raw) if raw is not None else {}
        # SFTTrainer.log adds the "eval_" prefix to what sits in self._metrics["eval"].
        scope = metric_key_prefix.removeprefix("eval").lstrip("_")
        for key, value in extra.items():
            self._metrics["eval"][f"{scope}_{key}" if scope else key].append(value)
        metrics = super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
        metrics.update({f"{metric_key_prefix}_{k}": v for k, v in extra.items()})
        return metrics

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
        completions = [_strip_eos(c, eos) for c in subset["completion"]]
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
                        model,
                        self._tokenizer,
                        prompts,
                        completions,
                        max_new_tokens=args.reflection_max_new_tokens,
                        batch_size=args.per_device_eval_batch_size,
                        do_sample=args.reflection_do_sample,
                        max_length=args.max_length,
                        weights=weights,
                        synced_gpus=nproc > 1 and (self.is_deepspeed_enabled or self.is_fsdp_enabled),
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


# -- entry point ---------------------------------------------------------------------------------------------
@dataclass
class ReflectSFTScriptArguments:
    """Data arguments of ``reflect-trl sft`` (YAML keys = field names)."""

    dataset_path: str | None = field(
        default=None,
        metadata={
            "help": "Training data: a save_to_disk directory, a .jsonl file or a hub id (data/taxi/policy_reflect)."
        },
    )
    eval_dataset_path: str | None = field(
        default=None, metadata={"help": "Evaluation data (default: dataset_path, split dataset_eval_split)."}
    )
    dataset_train_split: str = field(default="train", metadata={"help": "Split used for training."})
    dataset_eval_split: str = field(default="validation", metadata={"help": "Split used for evaluation."})
    env_name: str | None = field(
        default=None,
        metadata={
            "aliases": ["--env"],
            "help": "Environment of the data (default stage order for curriculum_order).",
        },
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Use only the first N training rows."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Use only N evaluation rows (spread evenly)."}
    )
    metrics_file: str = field(
        default="sft_metrics.json", metadata={"help": "Final metrics file in output_dir."}
    )


def _load_data(script_args: ReflectSFTScriptArguments):
    from reflect_trl.datasets_io import available_splits, load_sft_dataset

    if not script_args.dataset_path:
        raise ValueError(
            "dataset_path is required (e.g. data/taxi/policy_reflect or data/taxi/policy_reflect.jsonl)"
        )
    train = load_sft_dataset(script_args.dataset_path, script_args.dataset_train_split)
    if script_args.max_train_samples is not None:
        train = train.select(range(min(script_args.max_train_samples, len(train))))
    eval_path = script_args.eval_dataset_path or script_args.dataset_path
    eval_dataset = None
    local = Path(eval_path).exists()
    if (
        script_args.eval_dataset_path
        or not local
        or script_args.dataset_eval_split in available_splits(eval_path)
    ):
        eval_dataset = load_sft_dataset(eval_path, script_args.dataset_eval_split)
        if script_args.max_eval_samples is not None:
            eval_dataset = eval_dataset.select(
                spread_indices(len(eval_dataset), script_args.max_eval_samples)
            )
    else:
        logger.warning(
            "%s has no %r split: training without evaluation", eval_path, script_args.dataset_eval_split
        )
    return train, eval_dataset


def run_sft(
    script_args: ReflectSFTScriptArguments, training_args: ReflectSFTConfig, model_args
) -> dict[str, Any]:
    """Train the policy or the reflection model; save model (adapter or full) + tokenizer and the final metrics
    to ``training_args.output_dir``. Returns the metrics written to ``<output_dir>/<metrics_file>``."""
    from transformers import AutoTokenizer
    from trl import get_peft_config, get_quantization_config

    started = time.perf_counter()
    if model_args.model_name_or_path is None:
        raise ValueError(
            "model_name_or_path is required (a hub id or a local directory such as models/tiny-gpt2)"
        )
    if training_args.curriculum_order and not training_args.stages and script_args.env_name:
        from reflect_trl.envs import get_env_class

        training_args.stages = list(get_env_class(script_args.env_name).stages)
    configure_tracking(training_args.report_to, training_args.output_dir)

    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path,
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    quantization_config = get_quantization_config(model_args)
    model_init_kwargs: dict[str, Any] = {
        "revision": model_args.model_revision,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
    }
    if quantization_config is not None:
        from accelerate import PartialState

        model_init_kwargs["device_map"] = {"": PartialState().local_process_index}
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = model_init_kwargs

    train_dataset, eval_dataset = _load_data(script_args)
    if eval_dataset is None and training_args.eval_strategy != "no":
        logger.warning("no evaluation data: eval_strategy %r turned off", training_args.eval_strategy)
        training_args.eval_strategy = "no"

    trainer = ReflectSFTTrainer(
        model=model_args.model_name_or_path,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        quantization_config=quantization_config,
    )
    train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    metrics: dict[str, Any] = {
        f"train_{k}" if not k.startswith("train") else k: v for k, v in train_result.metrics.items()
    }
    if eval_dataset is not None:
        metrics.update(trainer.evaluate())
    metrics.update(
        {
            "role": training_args.role,
            "model_name_or_path": model_args.model_name_or_path,
            "dataset_path": script_args.dataset_path,
            "eval_dataset_path": script_args.eval_dataset_path or script_args.dataset_path,
            "train_rows": len(train_dataset),
            "eval_rows": len(eval_dataset) if eval_dataset is not None else 0,
            "peft": model_args.use_peft,
            "wall_seconds": time.perf_counter() - started,
        }
    )
    if trainer.accelerator.is_main_process:
        path = Path(training_args.output_dir) / script_args.metrics_file
        path.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
        logger.info("final metrics written to %s", path)
    if hasattr(trainer, "end"):
        trainer.end()
    return metrics


def sft_parser():
    """The ``TrlParser`` of ``reflect-trl sft`` (``--config recipe.yaml`` + command-line overrides)."""
    from trl import ModelConfig, TrlParser

    return TrlParser((ReflectSFTScriptArguments, ReflectSFTConfig, ModelConfig))


def run_sft_cli(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """``reflect-trl sft --config recipes/taxi/cpu/sft_policy.yaml [--max_steps 10 ...]``."""
    script_args, training_args, model_args = sft_parser().parse_args_and_config(args=argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return run_sft(script_args, training_args, model_args)


__all__ = [
    "CurriculumOrderedSampler",
    "ReflectSFTConfig",
    "ReflectSFTScriptArguments",
    "ReflectSFTTrainer",
    "check_role_data",
    "count_options",
    "policy_option_metrics",
    "reflection_generation_metrics",
    "run_sft",
    "run_sft_cli",
    "sft_parser",
]
