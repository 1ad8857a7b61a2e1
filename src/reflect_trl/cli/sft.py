"""``reflect-trl sft``: the entry point of stage 1 of Reflect-RL (also under ``accelerate launch``).

The pieces live in their own modules, TRL-style: :mod:`~reflect_trl.trainers.sft_config` (``ReflectSFTConfig``),
:mod:`~reflect_trl.trainers.sft_trainer` (``ReflectSFTTrainer``), :mod:`~reflect_trl.trainers.sft_metrics`,
:mod:`~reflect_trl.trainers.sft_data` (data checks) and :mod:`~reflect_trl.trainers.curriculum_sampler`; they are
re-exported here. :func:`run_sft` loads the data and the model, resolves the option labels (configured, else
recorded next to the data set, else the defaults), trains, and saves the model, its labels, the trainer state and
the final metrics (``train_results.json``, ``eval_results.json``, ``all_results.json`` through
``trainer.save_metrics``, and the run summary ``sft_metrics.json``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reflect_trl.errors import UsageError, describe, usage_errors
from reflect_trl.prompts import resolve_option_labels
from reflect_trl.tracking import configure_tracking
from reflect_trl.trainers.curriculum_sampler import CurriculumOrderedSampler, stage_order
from reflect_trl.trainers.sft_config import ROLES, ReflectSFTConfig
from reflect_trl.trainers.sft_data import check_role_data, check_sft_dataset, count_options
from reflect_trl.trainers.sft_metrics import (
    policy_option_metrics,
    reflection_generation_metrics,
    spread_indices,
)
from reflect_trl.trainers.sft_trainer import ReflectSFTTrainer
from reflect_trl.validation import check_env, check_label_tokens, check_model_path, removed_on_failure

logger = logging.getLogger(__name__)

#: Description of ``reflect-trl sft`` (its ``--help``).
SFT_DESCRIPTION = (
    "Stage 1 of Reflect-RL: supervised warm-up of the policy (role: policy; the completion is an option label) "
    "or of the reflection model (role: reflection) on the prompt/completion data of `reflect-trl data` "
    "(ReflectSFTTrainer, a trl.SFTTrainer)."
)


# -- script arguments ----------------------------------------------------------------------------------------
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
    match_oracle_labels_of: str | None = field(
        default=None,
        metadata={
            "help": "An RL run whose reflection player learned from the environment's oracle (its "
            "reflection_labels.json): train on as many rows as the oracle-labelled reflection turns that run used, "
            "i.e. max_steps = ceil(turns / (per_device_train_batch_size * gradient_accumulation_steps * processes)) "
            "-- the label-matched off-policy control of the verified reflection reward."
        },
    )


def _load_data(script_args: ReflectSFTScriptArguments):
    from reflect_trl.data.io import available_splits, load_sft_dataset

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


def data_labels_dir(dataset_path: str | None) -> Path | None:
    """The directory where the data builder recorded the option labels of a local ``dataset_path`` (its parent:
    ``data/<env>/`` for ``data/<env>/<name>`` or ``data/<env>/<name>.jsonl``); None for a hub id."""
    if not dataset_path or not Path(dataset_path).exists():
        return None
    return Path(dataset_path).resolve().parent


def resolve_sft_labels(
    script_args: ReflectSFTScriptArguments, training_args: ReflectSFTConfig
) -> tuple[str, ...]:
    """Set ``training_args.option_labels`` to the configured labels, else those recorded next to the data set,
    else the defaults; configured labels that differ from the recorded ones are an error."""
    labels = resolve_option_labels(
        training_args.option_labels,
        data_labels_dir(script_args.dataset_path),
        what=f"the data set {script_args.dataset_path}",
    )
    training_args.option_labels = list(labels)
    return labels


def prepare_sft(script_args: ReflectSFTScriptArguments, training_args: ReflectSFTConfig, model_args):
    """Check the input of ``reflect-trl sft`` before anything is written: the model path, the environment, the
    option labels against the tokenizer, the data and its fit to ``role``. Returns (tokenizer, train, eval data);
    raises :class:`~reflect_trl.errors.UsageError`."""
    from transformers import AutoTokenizer

    if model_args.model_name_or_path is None:
        raise UsageError(
            "model_name_or_path is required (a hub id or a local directory such as models/tiny-gpt2)"
        )
    check_model_path(model_args.model_name_or_path, "model_name_or_path")
    if not script_args.dataset_path:
        raise UsageError(
            "dataset_path is required (e.g. data/taxi/policy_reflect or data/taxi/policy_reflect.jsonl)"
        )
    if script_args.env_name:
        env = check_env(script_args.env_name)
        if training_args.curriculum_order and not training_args.stages:
            training_args.stages = list(env.stages)
    with usage_errors("option_labels"):
        resolve_sft_labels(script_args, training_args)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            model_args.model_name_or_path,
            revision=model_args.model_revision,
            trust_remote_code=training_args.trust_remote_code,
        )
    except (OSError, ValueError) as err:
        raise UsageError(
            f"model_name_or_path {model_args.model_name_or_path!r}: cannot load its tokenizer "
            f"({describe(err).splitlines()[0]})"
        ) from err
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if training_args.role == "policy":
        check_label_tokens(tokenizer, training_args.labels, "option_labels")
    with usage_errors():
        train_dataset, eval_dataset = _load_data(script_args)
        check_sft_dataset(train_dataset, script_args.dataset_path, training_args.role, training_args.labels)
        eval_source = script_args.eval_dataset_path or script_args.dataset_path
        check_sft_dataset(eval_dataset, eval_source, training_args.role, training_args.labels)
    if script_args.match_oracle_labels_of:
        training_args.max_steps = label_matched_steps(script_args.match_oracle_labels_of, training_args)
    if training_args.curriculum_order and "difficulty" not in train_dataset.column_names:
        raise UsageError(
            f"curriculum_order needs a 'difficulty' column in {script_args.dataset_path}; columns present: "
            f"{train_dataset.column_names} (data from `reflect-trl data` has it)"
        )
    return tokenizer, train_dataset, eval_dataset


def label_matched_steps(run_dir: str, training_args: ReflectSFTConfig) -> int:
    """The optimizer steps that show as many rows as the oracle-labelled reflection turns of the RL run ``run_dir``
    (``reflection_labels.json``, written by ``ReflectPPOTrainer`` when its reflection player learns)."""
    from reflect_trl.trainers.rl_state import ORACLE_LABELS_FILE

    path = Path(run_dir) / ORACLE_LABELS_FILE
    try:
        turns = int(json.loads(path.read_text())["oracle_labelled_turns"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UsageError(
            f"match_oracle_labels_of: cannot read the oracle-labelled turns from {path} ({describe(err)}); name the "
            "output_dir of an RL run with train_reflection and reflection_reward verified / mixed or "
            "reflection_objective oracle_sft"
        ) from None
    rows_per_step = (
        training_args.per_device_train_batch_size
        * training_args.gradient_accumulation_steps
        * max(training_args.world_size, 1)
    )
    steps = max(1, -(-turns // rows_per_step))
    logger.info("match_oracle_labels_of %s: %d labelled turns -> max_steps %d", run_dir, turns, steps)
    return steps


def sft_resume_checkpoint(training_args: ReflectSFTConfig) -> str | None:
    """The checkpoint ``training_args.resume_from_checkpoint`` names (``true``: the newest complete one of
    ``output_dir``, skipping partial ones; :mod:`reflect_trl.trainers.checkpoints`); None for a fresh run."""
    from reflect_trl.prompts import LABELS_FILE
    from reflect_trl.trainers.checkpoints import resolve_resume_from_checkpoint

    if training_args.resume_from_checkpoint is None:
        return None
    return resolve_resume_from_checkpoint(
        training_args.resume_from_checkpoint,
        training_args.output_dir,
        required=[LABELS_FILE] if training_args.role == "policy" else [],
        needs_optimizer=not training_args.save_only_model,
        warn=training_args.process_index == 0,  # one warning per run, not per process
    )


def run_sft(
    script_args: ReflectSFTScriptArguments, training_args: ReflectSFTConfig, model_args
) -> dict[str, Any]:
    """Train the policy or the reflection model; save model (adapter or full) + tokenizer, the option labels (policy),
    the trainer state, the final metrics and the model card to ``training_args.output_dir``. Returns the metrics
    written to ``<output_dir>/<metrics_file>``. The input is checked (:func:`prepare_sft`) before anything is
    written; a setup that still fails removes the output directory it created."""
    from trl import get_quantization_config

    from reflect_trl.lora import lora_config

    started = time.perf_counter()
    tokenizer, train_dataset, eval_dataset = prepare_sft(script_args, training_args, model_args)
    training_args.resume_from_checkpoint = sft_resume_checkpoint(training_args)

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

    if eval_dataset is None and training_args.eval_strategy != "no":
        logger.warning("no evaluation data: eval_strategy %r turned off", training_args.eval_strategy)
        training_args.eval_strategy = "no"

    with removed_on_failure(training_args.output_dir):
        configure_tracking(training_args.report_to, training_args.output_dir)
        trainer = ReflectSFTTrainer(
            model=model_args.model_name_or_path,
            args=training_args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=tokenizer,
            peft_config=lora_config(model_args, model_args.model_name_or_path),  # all-linear by default
            quantization_config=quantization_config,
        )
    train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    train_metrics = dict(train_result.metrics)
    train_metrics["train_samples"] = len(train_dataset)
    trainer.log_metrics("train", train_metrics)
    trainer.save_metrics("train", train_metrics)
    trainer.save_state()
    metrics: dict[str, Any] = {
        k if k.startswith("train") else f"train_{k}": v for k, v in train_metrics.items()
    }
    if eval_dataset is not None:
        eval_metrics = trainer.evaluate()
        eval_metrics["eval_samples"] = len(eval_dataset)
        trainer.log_metrics("eval", eval_metrics)
        trainer.save_metrics("eval", eval_metrics)
        metrics.update(eval_metrics)
    metrics.update(
        {
            "role": training_args.role,
            "model_name_or_path": model_args.model_name_or_path,
            "dataset_path": script_args.dataset_path,
            "eval_dataset_path": script_args.eval_dataset_path or script_args.dataset_path,
            "train_rows": len(train_dataset),
            "eval_rows": len(eval_dataset) if eval_dataset is not None else 0,
            "option_labels": list(training_args.labels),
            "peft": model_args.use_peft,
            "wall_seconds": time.perf_counter() - started,
        }
    )
    if trainer.accelerator.is_main_process:
        path = Path(training_args.output_dir) / script_args.metrics_file
        path.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
        logger.info("final metrics written to %s", path)
    trainer.create_model_card(
        model_name=Path(training_args.output_dir).name, dataset_name=script_args.dataset_path
    )
    if hasattr(trainer, "end"):
        trainer.end()
    return metrics


def sft_parser():
    """The ``TrlParser`` of ``reflect-trl sft`` (``--config recipe.yaml`` + command-line overrides)."""
    from trl import ModelConfig, TrlParser

    return TrlParser((ReflectSFTScriptArguments, ReflectSFTConfig, ModelConfig))


def run_sft_cli(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """``reflect-trl sft --config recipes/taxi/cpu/sft_policy.yaml [--max_steps 10 ...]``."""
    from reflect_trl.cli.option_table import parse_recipe

    script_args, training_args, model_args = parse_recipe(
        sft_parser(),
        argv,
        "sft",
        SFT_DESCRIPTION,
        own=(ReflectSFTScriptArguments, ReflectSFTConfig),
    )
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return run_sft(script_args, training_args, model_args)


__all__ = [
    "ROLES",
    "SFT_DESCRIPTION",
    "CurriculumOrderedSampler",
    "ReflectSFTConfig",
    "ReflectSFTScriptArguments",
    "ReflectSFTTrainer",
    "check_role_data",
    "check_sft_dataset",
    "count_options",
    "data_labels_dir",
    "label_matched_steps",
    "policy_option_metrics",
    "prepare_sft",
    "reflection_generation_metrics",
    "resolve_sft_labels",
    "run_sft",
    "run_sft_cli",
    "sft_parser",
    "sft_resume_checkpoint",
    "spread_indices",
    "stage_order",
]
