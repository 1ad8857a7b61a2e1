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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reflect_trl.config_lists import parse_list
from reflect_trl.datasets_io import SPLIT_COLUMN, write_jsonl
from reflect_trl.envs import Observation, Task, TextEnv, make_env
from reflect_trl.prompts import (
    DEFAULT_LABELS,
    LABELS_FILE,
    STOP_MARKER,
    build_prompt,
    parse_option_labels,
    reflection_prompt,
    with_stop,
    write_option_labels,
)
from reflect_trl.reflection import ReflectionContext, Reflector, get_oracle_reflector
from reflect_trl.seeding import derive_seed

logger = logging.getLogger(__name__)

SPLIT_NAMES = ("train", "validation")
DATASET_NAMES = (
    "reflection",
    "policy_reflect",
    "policy_plain",
    "reflection_positive",
    "policy_reflect_positive",
)
METADATA_COLUMNS = (
    "task_id",
    "difficulty",
    "seed",
    "step",
    "is_negative",
    "num_options",
    "action_index",
    "action_text",
    "option_index",
    "last_action_index",
    "env",
)


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
        labels = parse_option_labels(self.option_labels)
        self.option_labels = list(labels) if labels is not None else None
        self.stages = parse_list(self.stages, "stages")

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(self.option_labels) if self.option_labels else DEFAULT_LABELS


@dataclass(frozen=True)
class StepRecord:
    """One decision point of a played trajectory."""

    task: Task
    step: int
    observation: Observation
    oracle_action: int
    reflection: str
    is_negative: bool
    last_action_index: int


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


# -- trajectories --------------------------------------------------------------------------------------------
def oracle_outcome(env: TextEnv) -> tuple[bool, int]:
    """(success, steps) of following the oracle from ``env``'s current state (plays on ``env``: pass a clone)."""
    steps = 0
    while not env.done:
        _, _, terminated, truncated, info = env.step(env.oracle_action())
        steps += 1
        if terminated or truncated:
            return bool(info.get("success", False)), steps
    return False, steps


def candidate_mistakes(env: TextEnv, oracle: int, verify: bool) -> list[int]:
    """Legal non-oracle actions that do not end the episode (and, with ``verify``, are strictly worse)."""
    assert env.observation is not None
    baseline: tuple[bool, int] | None = None
    if verify:
        probe = env.clone()
        _, _, terminated, truncated, info = probe.step(oracle)
        baseline = (bool(info.get("success", False)), 1) if terminated or truncated else None
        if baseline is None:
            success, steps = oracle_outcome(probe)
            baseline = (success, steps + 1)
    candidates = []
    for action in range(len(env.observation.actions)):
        if action == oracle:
            continue
        probe = env.clone()
        _, _, terminated, truncated, _ = probe.step(action)
        if terminated or truncated:
            continue
        if verify and baseline is not None and baseline[0]:
            # Strictly worse than the oracle's action: after it the oracle fails, or needs more steps in total.
            # (When the oracle itself does not succeed from here there is nothing to compare with.)
            success, steps = oracle_outcome(probe)
            if success and steps + 1 <= baseline[1]:
                continue
        candidates.append(action)
    return candidates


def play_trajectory(
    env: TextEnv,
    task: Task,
    reflector: Reflector,
    reflection_seed: int,
    inject_at: Sequence[int] = (),
    inject_rng: random.Random | None = None,
    verify_mistakes: bool = True,
) -> tuple[list[StepRecord], int, bool]:
    """Play ``task`` with the oracle, taking a wrong action at the decision points ``inject_at`` (postponed to
    the next point when none qualifies). Return the step records, the number of mistakes taken and whether the
    episode ended in success."""
    rng = random.Random(reflection_seed)
    pending = sorted(set(inject_at))
    obs = env.reset(task=task)
    records: list[StepRecord] = []
    previous_obs: Observation | None = None
    last_action: int | None = None
    last_was_oracle: bool | None = None
    last_reward: float | None = None
    last_info: dict[str, Any] = {}
    mistakes = 0
    step = 0
    while True:
        oracle = env.oracle_action()
        ctx = ReflectionContext(
            env=env,
            observation=obs,
            step=step,
            oracle_action=oracle,
            previous_observation=previous_obs,
            last_action=None
            if last_action is None or previous_obs is None
            else previous_obs.actions[last_action],
            last_action_was_oracle=last_was_oracle,
            last_reward=last_reward,
            info=dict(last_info),
        )
        reflection = reflector.reflect(ctx, rng)
        records.append(
            StepRecord(
                task=task,
                step=step,
                observation=obs,
                oracle_action=oracle,
                reflection=reflection,
                is_negative=last_was_oracle is False,
                last_action_index=-1 if last_action is None else last_action,
            )
        )
        action, was_oracle = oracle, True
        # Inject at a scheduled point, never right after a mistake (the recovery step takes the oracle's action).
        if pending and step >= pending[0] and last_was_oracle is not False:
            choices = candidate_mistakes(env, oracle, verify_mistakes)
            if choices:
                assert inject_rng is not None
                action, was_oracle = inject_rng.choice(choices), False
                pending.pop(0)
                mistakes += 1
        previous_obs = obs
        obs, last_reward, terminated, truncated, last_info = env.step(action)
        last_action, last_was_oracle = action, was_oracle
        step += 1
        if terminated or truncated:
            return records, mistakes, bool(last_info.get("success", False))


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
    option = with_reflection.option_of(record.oracle_action)
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
    positive, _, success = play_trajectory(
        env, task, reflector, reflection_seed, verify_mistakes=config.verify_mistakes
    )
    stats.trajectories[key] += 1
    stats.oracle_successes[key] += int(success)
    mixed = positive
    inject_rng = random.Random(derive_seed(config.seed, task.task_id, "inject"))
    if config.negatives_per_trajectory > 0 and inject_rng.random() < config.negative_prob:
        points = sorted(
            inject_rng.sample(range(len(positive)), min(config.negatives_per_trajectory, len(positive)))
        )
        negative, mistakes, _ = play_trajectory(
            env, task, reflector, reflection_seed, points, inject_rng, config.verify_mistakes
        )
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
    (out / "README.md").write_text(dataset_card(config, rows, stats), encoding="utf-8")
    write_option_labels(out, config.labels)
    logger.info("wrote %s data sets to %s", len(DATASET_NAMES), out)
    return result


# -- data card -----------------------------------------------------------------------------------------------
def dataset_card(
    config: DataBuilderConfig, rows: dict[str, dict[str, list[dict[str, Any]]]], stats: BuildStats
) -> str:
    """A deterministic Markdown card: how the data was generated, and what it contains."""
    import datasets as hf_datasets

    from reflect_trl import __version__

    lines = [
        f"# reflect-trl SFT data: {config.env_name}",
        "",
        "Generated offline by `reflect_trl.data_builder.build_datasets` from the environment's oracle and its "
        "oracle reflector (no model or API calls). Same configuration, same bytes in the `.jsonl` files.",
        "",
        f"- reflect-trl {__version__}, datasets {hf_datasets.__version__}",
        f"- environment `{config.env_name}`, kwargs `{json.dumps(config.env_kwargs, sort_keys=True)}`",
        f"- seed {config.seed}; {config.n_train_tasks} train and {config.n_val_tasks} validation tasks per stage",
        f"- negative_prob {config.negative_prob}, negatives_per_trajectory {config.negatives_per_trajectory}, "
        f"verify_mistakes {config.verify_mistakes}, shuffle_options {config.shuffle_options}",
        f"- stop marker `{STOP_MARKER}` ends every reflection target; policy targets are the oracle's option label",
        "",
        "## Configuration",
        "",
        "```json",
        json.dumps(asdict(config), indent=2, sort_keys=True),
        "```",
        "",
        "## Trajectories",
        "",
        "| split | difficulty | tasks | with injected mistakes | oracle success |",
        "|---|---|---|---|---|",
    ]
    for split, difficulty in sorted(stats.trajectories, key=lambda k: (SPLIT_NAMES.index(k[0]), str(k[1]))):
        key = (split, difficulty)
        lines.append(
            f"| {split} | {difficulty} | {stats.trajectories[key]} | {stats.negative_trajectories[key]} "
            f"| {stats.oracle_successes[key]} |"
        )
    negatives = sum(1 for split in SPLIT_NAMES for r in rows["reflection"][split] if r["is_negative"])
    total = sum(len(rows["reflection"][split]) for split in SPLIT_NAMES)
    lines += [
        "",
        f"Mistakes injected: {stats.mistakes}. Negative examples (steps right after a mistake): {negatives} of "
        f"{total} rows of the mixed data sets ({negatives / total if total else 0.0:.1%}); "
        f"{stats.negatives_naming_recovery} of them name the recovery action's text in their reflection. "
        f"Empty reflections: {stats.empty_reflections}.",
        "",
        "## Rows per data set, split and difficulty",
        "",
        "| data set | split | difficulty | rows | negative rows |",
        "|---|---|---|---|---|",
    ]
    for name in DATASET_NAMES:
        for split in SPLIT_NAMES:
            per = Counter(r["difficulty"] for r in rows[name][split])
            neg = Counter(r["difficulty"] for r in rows[name][split] if r["is_negative"])
            for difficulty in sorted(per):
                lines.append(f"| {name} | {split} | {difficulty} | {per[difficulty]} | {neg[difficulty]} |")
    lines += [
        "",
        "## Files",
        "",
        "- `<name>/`: `DatasetDict` (`train`, `validation`) saved with `save_to_disk`;",
        "- `<name>.jsonl`: the same rows, one JSON object per line, `split` first;",
        f"- `{LABELS_FILE}`: the option labels of the policy prompts (read by `reflect-trl sft`);",
        "- columns: `prompt`, `completion`, " + ", ".join(f"`{c}`" for c in METADATA_COLUMNS) + ".",
        "",
    ]
    return "\n".join(lines)


# -- command line --------------------------------------------------------------------------------------------
def check_data_config(config: DataBuilderConfig) -> None:
    """Up-front checks of ``reflect-trl data`` (nothing is written before): the environment, its kwargs and stages,
    an oracle reflector for it, and output paths that the builder may replace."""
    from reflect_trl.errors import UsageError, describe
    from reflect_trl.validation import check_env

    check_env(config.env_name, config.env_kwargs, config.stages)
    try:
        get_oracle_reflector(config.env_name)
    except (KeyError, ImportError) as err:
        raise UsageError(f"env_name {config.env_name!r}: {describe(err)}") from err
    out = Path(config.output_dir) / config.env_name
    if out.exists() and not out.is_dir():
        raise UsageError(f"output_dir: {out} is a file; choose another output_dir")
    for name in DATASET_NAMES:
        path = out / name
        if (
            path.exists()
            and not (path / "dataset_dict.json").is_file()
            and not (path.is_dir() and not any(path.iterdir()))
        ):
            raise UsageError(
                f"output_dir: {path} exists and is not a saved data set; move it away or choose another output_dir"
            )


def build_datasets_cli(argv: Sequence[str] | None = None) -> int:
    """``reflect-trl data --config recipes/taxi/data.yaml [--seed 1 ...]``: build and save the data sets."""
    from trl import TrlParser

    from reflect_trl.recipe_cli import parse_recipe

    (config,) = parse_recipe(
        TrlParser((DataBuilderConfig,)),
        argv,
        "data",
        "Generate the reflection / policy SFT data sets of an environment: oracle trajectories with injected "
        "mistakes (negative examples), saved under <output_dir>/<env_name>/ (save_to_disk + JSONL + a data card).",
        own=(DataBuilderConfig,),
    )
    check_data_config(config)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    result = build_datasets(config)
    out = Path(config.output_dir) / config.env_name
    for name, dataset in result.items():
        sizes = ", ".join(f"{split} {len(dataset[split])}" for split in dataset)
        print(f"{out / name} ({sizes}); {out / name}.jsonl")
    print(f"data card: {out / 'README.md'}")
    return 0


__all__ = [
    "DATASET_NAMES",
    "METADATA_COLUMNS",
    "DataBuilderConfig",
    "StepRecord",
    "build_datasets",
    "build_datasets_cli",
    "candidate_mistakes",
    "check_data_config",
    "dataset_features",
    "generate_rows",
    "play_trajectory",
    "rows_for",
]
