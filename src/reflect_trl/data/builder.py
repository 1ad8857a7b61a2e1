"""SFT data for the reflection model and the policy, with injected mistakes (negative examples).

For every task (``env.make_tasks(split, n, seed, stage)`` for each requested stage, train and validation) the
builder plays the **oracle trajectory** and records one step per decision point. With probability
``negative_prob`` it also plays a **negative trajectory** of the same task: at up to
``negatives_per_trajectory`` random decision points it takes a wrong action instead of the oracle's -- a legal
action that is not the oracle's, does not end the episode (tried on ``env.clone()`` first) and, with
``verify_mistakes``, is strictly worse than the oracle's action (the oracle needs more steps, or fails, after it;
an equally short alternative route is not a mistake). The decision point right after a mistake is a
**negative example**: its reflection is written with ``last_action_was_oracle=False`` and names the mistake and
the recovery, and the policy target is the oracle's recovery action. If no wrong action qualifies at a chosen
point, the injection moves to the next decision point. Policy targets are always the oracle's action (the
reference code trained on the executed, mostly random, action).

Data sets (prompt/completion format, every prompt from :mod:`reflect_trl.prompts`):

* ``reflection``: ``reflection_prompt(state)`` -> ``reflection + STOP_MARKER``;
* ``policy_reflect``: ``build_prompt(state, actions, reflection)`` -> the oracle action's option label;
* ``policy_plain``: ``build_prompt(state, actions, None)`` -> the label;
* ``reflection_positive`` / ``policy_reflect_positive`` (the "w/o negative examples" ablation): the same built
  from the oracle trajectories of the same tasks only.

The mixed data sets hold, per task, the negative trajectory if one was played and the oracle trajectory
otherwise (so each task contributes one trajectory to every data set). Both trajectories of a task draw their
reflections from the same seeded stream, so the steps before the first mistake are identical.

Each row also carries ``task_id, difficulty, seed, step, is_negative, num_options, action_index, action_text,
option_index, last_action_index, env`` (``action_index`` / ``action_text``: the oracle action's index among the
environment's actions and its text;
``option_index``: its position in the prompt, different only with ``shuffle_options``; ``last_action_index``: the
action taken just before, -1 at the first step).

Output, under ``<output_dir>/<env>/``: ``<name>/`` (``DatasetDict.save_to_disk`` with ``train`` and
``validation``), ``<name>.jsonl`` (all rows, ``split`` field first; byte-identical for the same config),
``README.md`` (the data card) and :data:`~reflect_trl.prompts.LABELS_FILE` (the option labels of the policy
prompts; ``reflect-trl sft`` reads it next to its ``dataset_path``).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reflect_trl.config_lists import parse_list
from reflect_trl.data.card import dataset_card, length_stats, load_length_tokenizer, option_lists_summary
from reflect_trl.data.io import DATASET_NAMES, METADATA_COLUMNS, SPLIT_COLUMN, SPLIT_NAMES, write_jsonl
from reflect_trl.data.trajectories import StepRecord, play_trajectory
from reflect_trl.envs import OracleUnavailableError, Task, TextEnv, make_env
from reflect_trl.prompts import (
    DEFAULT_LABELS,
    LABELS_FILE,
    build_prompt,
    parse_option_labels,
    reflection_prompt,
    with_stop,
    write_option_labels,
)
from reflect_trl.reflection import Reflector, get_oracle_reflector
from reflect_trl.seeding import derive_seed

logger = logging.getLogger(__name__)

POLICY_TARGETS = ("oracle", "executed")


@dataclass
class DataBuilderConfig:
    """What to generate. YAML keys = field names (``env_name``, not ``env``: TRL's parser reserves the ``env``
    key of a config file for environment variables; on the command line ``--env`` works too)."""

    env_name: str = field(
        default="taxi", metadata={"aliases": ["--env"], "help": "Registered environment name (e.g. taxi)."}
    )
    env_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={"help": "Keyword arguments of the environment (a JSON object on the command line)."},
    )
    n_train_tasks: int = field(default=200, metadata={"help": "Training tasks per stage."})
    n_val_tasks: int = field(default=40, metadata={"help": "Validation tasks per stage."})
    stages: list[str] | None = field(
        default=None, metadata={"help": "Stages (difficulties) to generate, easy to hard; default: all."}
    )
    negative_prob: float = field(
        default=0.5,
        metadata={"help": "Probability that a task also gets a trajectory with injected mistakes."},
    )
    negatives_per_trajectory: int = field(
        default=1, metadata={"help": "Most mistakes injected per trajectory."}
    )
    verify_mistakes: bool = field(
        default=True,
        metadata={
            "help": "Only inject actions that are strictly worse than the oracle's (checked by oracle rollouts)."
        },
    )
    random_action_prob: float = field(
        default=0.0,
        metadata={
            "help": "The reference code's 'oracle + random p' trajectories (Taxi: p = 0.9): every step takes a uniformly "
            "drawn action with this probability (crashes included) instead of injecting mistakes; 0 = oracle "
            "trajectories with injected mistakes (negative_prob)."
        },
    )
    policy_targets: str = field(
        default="oracle",
        metadata={
            "help": "Policy SFT target: the oracle's action ('oracle'), or the action the trajectory executed "
            "('executed', the reference code's Taxi data: mostly random with random_action_prob 0.9)."
        },
    )
    seed: int = field(default=0, metadata={"help": "Seed of tasks, injections and reflection wording."})
    output_dir: str = field(
        default="data", metadata={"help": "Root directory; files go to <output_dir>/<env>/."}
    )
    shuffle_options: bool = field(
        default=False, metadata={"help": "Shuffle the option order per state (seeded); the label follows it."}
    )
    option_labels: list[str] | str | None = field(
        default=None,
        metadata={
            "help": "Option labels: a list, a comma-separated string or one string of single characters "
            "(ABCDEF); default A-Z, a-z, 0-9. Recorded in <output_dir>/<env>/" + LABELS_FILE + "."
        },
    )
    tokenizer_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "A tokenizer (model directory or hub id) that counts the reflection and prompt lengths in the "
            "data card and the command's summary: reflection_max_new_tokens must exceed the longest reflection. "
            "Default: lengths in characters, tokens estimated."
        },
    )
    progress: bool = field(default=True, metadata={"help": "Show a progress bar."})

    def __post_init__(self) -> None:
        if isinstance(self.env_kwargs, str):
            try:
                self.env_kwargs = json.loads(self.env_kwargs) if self.env_kwargs.strip() else {}
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"env_kwargs must be a JSON object, got {self.env_kwargs!r}: {err}"
                ) from None
        if self.env_kwargs is None:
            self.env_kwargs = {}
        if not isinstance(self.env_kwargs, dict):
            raise ValueError(f"env_kwargs must be a mapping, got {type(self.env_kwargs).__name__}")
        if not 0.0 <= self.negative_prob <= 1.0:
            raise ValueError(f"negative_prob must be in [0, 1], got {self.negative_prob}")
        if self.negatives_per_trajectory < 0:
            raise ValueError(f"negatives_per_trajectory must be >= 0, got {self.negatives_per_trajectory}")
        if self.n_train_tasks < 0 or self.n_val_tasks < 0:
            raise ValueError(f"task counts must be >= 0, got {self.n_train_tasks}, {self.n_val_tasks}")
        if not 0.0 <= self.random_action_prob <= 1.0:
            raise ValueError(f"random_action_prob must be in [0, 1], got {self.random_action_prob}")
        if self.policy_targets not in POLICY_TARGETS:
            raise ValueError(f"policy_targets={self.policy_targets!r}; choose one of {POLICY_TARGETS}")
        labels = parse_option_labels(self.option_labels)
        self.option_labels = list(labels) if labels is not None else None
        self.stages = parse_list(self.stages, "stages")

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(self.option_labels) if self.option_labels else DEFAULT_LABELS


@dataclass
class BuildStats:
    """Counters for the data card."""

    trajectories: Counter = field(default_factory=Counter)  # (split, difficulty) -> tasks
    # (split, difficulty) -> trajectories with at least one injected mistake
    negative_trajectories: Counter = field(default_factory=Counter)
    mistakes: int = 0
    negatives_naming_recovery: int = 0
    empty_reflections: int = 0
    oracle_successes: Counter = field(default_factory=Counter)  # (split, difficulty) -> oracle succeeded
    # (split, difficulty) -> tasks skipped: the option settings pruned the oracle's next action (OracleUnavailableError)
    unsolvable: Counter = field(default_factory=Counter)


# -- rows ----------------------------------------------------------------------------------------------------
def _metadata(record: StepRecord, env_name: str, option_index: int) -> dict[str, Any]:
    return {
        "task_id": record.task.task_id,
        "difficulty": record.task.difficulty,
        "seed": record.task.seed,
        "step": record.step,
        "is_negative": record.is_negative,
        "num_options": len(record.observation.actions),
        "action_index": record.oracle_action,
        "action_text": record.observation.actions[record.oracle_action],
        "option_index": option_index,
        "last_action_index": record.last_action_index,
        "env": env_name,
    }


def rows_for(record: StepRecord, config: DataBuilderConfig, variant: str) -> dict[str, dict[str, Any]]:
    """The reflection / policy_reflect / policy_plain rows of one decision point."""
    obs = record.observation
    shuffle_seed = (
        derive_seed(config.seed, record.task.task_id, variant, record.step)
        if config.shuffle_options
        else None
    )
    with_reflection = build_prompt(
        obs.text, obs.actions, record.reflection, labels=config.labels, shuffle_seed=shuffle_seed
    )
    plain = build_prompt(obs.text, obs.actions, None, labels=config.labels, shuffle_seed=shuffle_seed)
    target = record.action if config.policy_targets == "executed" else record.oracle_action
    option = with_reflection.option_of(target)
    label = with_reflection.labels[option]
    meta = _metadata(record, config.env_name, option)
    return {
        "reflection": {
            "prompt": reflection_prompt(obs.text),
            "completion": with_stop(record.reflection),
            **meta,
        },
        "policy_reflect": {"prompt": with_reflection.text, "completion": label, **meta},
        "policy_plain": {"prompt": plain.text, "completion": label, **meta},
    }


def dataset_features():
    """Explicit column types (stable schemas, also for empty splits)."""
    from datasets import Features, Value

    return Features(
        {
            "prompt": Value("string"),
            "completion": Value("string"),
            "task_id": Value("string"),
            "difficulty": Value("string"),
            "seed": Value("int64"),
            "step": Value("int32"),
            "is_negative": Value("bool"),
            "num_options": Value("int32"),
            "action_index": Value("int32"),
            "action_text": Value("string"),
            "option_index": Value("int32"),
            "last_action_index": Value("int32"),
            "env": Value("string"),
        }
    )


# -- building ------------------------------------------------------------------------------------------------
def _selected_stages(env: TextEnv, stages: Sequence[str] | None) -> list[str]:
    if not stages:
        return list(env.stages) or [None]  # type: ignore[list-item]
    return [env.check_difficulty(s) for s in stages]


def generate_rows(
    config: DataBuilderConfig,
    env: TextEnv | None = None,
    reflector: Reflector | None = None,
) -> tuple[dict[str, dict[str, list[dict[str, Any]]]], BuildStats]:
    """All rows, as ``{dataset name: {split: [row, ...]}}``, plus counters. ``env``/``reflector`` default to
    ``make_env(config.env_name, **config.env_kwargs)`` and its oracle reflector."""
    env = env if env is not None else make_env(config.env_name, **config.env_kwargs)
    reflector = reflector if reflector is not None else get_oracle_reflector(config.env_name)
    stages = _selected_stages(env, config.stages)
    counts = {"train": config.n_train_tasks, "validation": config.n_val_tasks}
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {
        n: {s: [] for s in SPLIT_NAMES} for n in DATASET_NAMES
    }
    stats = BuildStats()
    plan = [(split, stage) for split in SPLIT_NAMES for stage in stages if counts[split] > 0]
    total = sum(counts[split] for split, _ in plan)
    progress = _progress_bar(total, config.progress, f"{config.env_name} data")
    for split, stage in plan:
        for task in env.make_tasks(split, counts[split], seed=config.seed, difficulty=stage):
            _build_task(env, task, split, config, reflector, rows, stats)
            progress.update(1)
    progress.close()
    return rows, stats


def _build_task(
    env: TextEnv,
    task: Task,
    split: str,
    config: DataBuilderConfig,
    reflector: Reflector,
    rows: dict[str, dict[str, list[dict[str, Any]]]],
    stats: BuildStats,
) -> None:
    key = (split, task.difficulty)
    reflection_seed = derive_seed(config.seed, task.task_id, "reflection")
    try:
        positive, _, success = play_trajectory(
            env, task, reflector, reflection_seed, verify_mistakes=config.verify_mistakes
        )
    except OracleUnavailableError:
        stats.unsolvable[key] += 1
        return
    stats.trajectories[key] += 1
    stats.oracle_successes[key] += int(success)
    mixed = positive
    inject_rng = random.Random(derive_seed(config.seed, task.task_id, "inject"))
    if config.random_action_prob > 0:  # the reference code's behaviour: oracle + random p
        behaviour, mistakes, _ = play_trajectory(
            env,
            task,
            reflector,
            reflection_seed,
            random_action_prob=config.random_action_prob,
            behaviour_rng=random.Random(derive_seed(config.seed, task.task_id, "behaviour")),
        )
        if mistakes:
            mixed = behaviour
            stats.negative_trajectories[key] += 1
            stats.mistakes += mistakes
    elif config.negatives_per_trajectory > 0 and inject_rng.random() < config.negative_prob:
        points = sorted(
            inject_rng.sample(range(len(positive)), min(config.negatives_per_trajectory, len(positive)))
        )
        try:
            negative, mistakes, _ = play_trajectory(
                env, task, reflector, reflection_seed, points, inject_rng, config.verify_mistakes
            )
        except (
            OracleUnavailableError
        ):  # the mistake led where the oracle cannot act: keep the oracle trajectory
            negative, mistakes = positive, 0
        if mistakes:
            mixed = negative
            stats.negative_trajectories[key] += 1
            stats.mistakes += mistakes
    for record in positive:
        for name, row in rows_for(record, config, "positive").items():
            if f"{name}_positive" in rows:
                rows[f"{name}_positive"][split].append(row)
    variant = "positive" if mixed is positive else "negative"
    for record in mixed:
        if not record.reflection.strip():
            stats.empty_reflections += 1
        if record.is_negative and record.observation.actions[record.oracle_action] in record.reflection:
            stats.negatives_naming_recovery += 1
        for name, row in rows_for(record, config, variant).items():
            rows[name][split].append(row)


def _progress_bar(total: int, enabled: bool, desc: str):
    from reflect_trl.progress import progress_bar

    return progress_bar(total=total, desc=desc, enabled=enabled, unit="task")


@contextmanager
def _quiet_datasets() -> Iterator[None]:
    """Silence the per-file progress bars of ``datasets`` (the builder shows its own)."""
    from datasets.utils import logging as ds_logging

    enabled = ds_logging.is_progress_bar_enabled()
    ds_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            ds_logging.enable_progress_bar()


def _prepare_output_dir(path: Path) -> None:
    """Remove a previously saved data set at ``path``; refuse to delete anything else."""
    if not path.exists():
        return
    if (path / "dataset_dict.json").is_file():
        shutil.rmtree(path)
    elif path.is_dir() and not any(path.iterdir()):
        path.rmdir()
    else:
        raise FileExistsError(
            f"{path} exists and is not a saved data set; move it away or choose another output_dir"
        )


def build_datasets(config: DataBuilderConfig, env: TextEnv | None = None, reflector: Reflector | None = None):
    """Generate, save (``save_to_disk`` + JSONL) and return ``{name: DatasetDict(train, validation)}``."""
    from datasets import Dataset, DatasetDict

    rows, stats = generate_rows(config, env, reflector)
    features = dataset_features()
    out = Path(config.output_dir) / config.env_name
    out.mkdir(parents=True, exist_ok=True)
    result = {}
    for name in DATASET_NAMES:
        dataset = DatasetDict(
            {split: Dataset.from_list(rows[name][split], features=features) for split in SPLIT_NAMES}
        )
        _prepare_output_dir(out / name)
        with _quiet_datasets():
            dataset.save_to_disk(str(out / name))
        write_jsonl(
            ({SPLIT_COLUMN: split, **row} for split in SPLIT_NAMES for row in rows[name][split]),
            out / f"{name}.jsonl",
        )
        result[name] = dataset
    lengths = length_stats(rows, load_length_tokenizer(config), config.tokenizer_name_or_path)
    (out / "README.md").write_text(dataset_card(config, rows, stats, lengths), encoding="utf-8")
    write_option_labels(out, config.labels)
    logger.info("wrote %s data sets to %s", len(DATASET_NAMES), out)
    logger.info("%s", lengths.summary())
    logger.info("options: %s", option_lists_summary(rows))
    return result


__all__ = [
    "DATASET_NAMES",
    "METADATA_COLUMNS",
    "DataBuilderConfig",
    "StepRecord",
    "build_datasets",
    "dataset_features",
    "generate_rows",
    "length_stats",
    "play_trajectory",
    "rows_for",
]
