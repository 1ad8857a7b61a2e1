"""The data card (``README.md`` next to the generated data sets) and the token lengths it reports."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from reflect_trl.data.io import DATASET_NAMES, METADATA_COLUMNS, SPLIT_NAMES
from reflect_trl.prompts import LABELS_FILE, STOP_MARKER, count_option_lists

if TYPE_CHECKING:
    from reflect_trl.data.builder import BuildStats, DataBuilderConfig


# -- lengths -------------------------------------------------------------------------------------------------
#: Characters per token assumed when no tokenizer is given (a tokenizer trained on the environment's text does better).
CHARS_PER_TOKEN = 3.0


@dataclass(frozen=True)
class LengthStats:
    """Lengths of the mixed data sets' texts: reflection targets (stop marker included) and policy prompts."""

    unit: str  # "tokens" (counted with ``tokenizer``) or "characters"
    tokenizer: str | None
    reflection_max: int
    reflection_p95: int
    reflection_mean: float
    prompt_max: int
    reflection_prompt_max: int

    def budget(self) -> int:
        """The smallest ``reflection_max_new_tokens`` that lets every reflection of the data end with its marker
        (estimated from characters without a tokenizer)."""
        if self.unit == "tokens":
            return self.reflection_max
        return math.ceil(self.reflection_max / CHARS_PER_TOKEN)

    def summary(self) -> str:
        """One line for the command's output."""
        if self.unit == "tokens":
            return (
                f"longest reflection {self.reflection_max} tokens with the stop marker (tokenizer {self.tokenizer}): "
                f"set reflection_max_new_tokens >= {self.budget()}; longest policy prompt {self.prompt_max} tokens"
            )
        return (
            f"longest reflection {self.reflection_max} characters with the stop marker (about {self.budget()} tokens; "
            "set tokenizer_name_or_path to count them): reflection_max_new_tokens must exceed it; longest policy "
            f"prompt {self.prompt_max} characters"
        )


def length_stats(
    rows: dict[str, dict[str, list[dict[str, Any]]]], tokenizer=None, name: str | None = None
) -> LengthStats:
    """:class:`LengthStats` of the mixed data sets (tokens with ``tokenizer``, else characters)."""

    def lengths(texts: list[str]) -> list[int]:
        if not texts:
            return [0]
        if tokenizer is None:
            return [len(t) for t in texts]
        return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]

    reflections = lengths([r["completion"] for split in SPLIT_NAMES for r in rows["reflection"][split]])
    reflection_prompts = lengths([r["prompt"] for split in SPLIT_NAMES for r in rows["reflection"][split]])
    prompts = lengths(
        [r["prompt"] + r["completion"] for split in SPLIT_NAMES for r in rows["policy_reflect"][split]]
    )
    ordered = sorted(reflections)
    return LengthStats(
        unit="tokens" if tokenizer is not None else "characters",
        tokenizer=name,
        reflection_max=ordered[-1],
        reflection_p95=ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)],
        reflection_mean=round(sum(ordered) / len(ordered), 1),
        prompt_max=max(prompts),
        reflection_prompt_max=max(reflection_prompts),
    )


def load_length_tokenizer(config: DataBuilderConfig):
    if not config.tokenizer_name_or_path:
        return None
    from reflect_trl.models import load_tokenizer

    return load_tokenizer(config.tokenizer_name_or_path)


def option_lists_summary(rows: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    """How many different option lists the policy prompts show, and what that asks of the policy (one line)."""
    from reflect_trl.envs.check import option_lists_note

    prompts = [r["prompt"] for split in SPLIT_NAMES for r in rows["policy_reflect"][split]]
    return option_lists_note(count_option_lists(prompts), len(prompts), over="policy prompts")


# -- data card -----------------------------------------------------------------------------------------------
def dataset_card(
    config: DataBuilderConfig,
    rows: dict[str, dict[str, list[dict[str, Any]]]],
    stats: BuildStats,
    lengths: LengthStats | None = None,
) -> str:
    """A deterministic Markdown card: how the data was generated, and what it contains."""
    import datasets as hf_datasets

    from reflect_trl import __version__

    lines = [
        f"# reflect-trl SFT data: {config.env_name}",
        "",
        "Generated offline by `reflect_trl.data.builder.build_datasets` from the environment's oracle and its "
        "oracle reflector (no model or API calls). Same configuration, same bytes in the `.jsonl` files.",
        "",
        f"- reflect-trl {__version__}, datasets {hf_datasets.__version__}",
        f"- environment `{config.env_name}`, kwargs `{json.dumps(config.env_kwargs, sort_keys=True)}`",
        f"- seed {config.seed}; {config.n_train_tasks} train and {config.n_val_tasks} validation tasks per stage",
        f"- negative_prob {config.negative_prob}, negatives_per_trajectory {config.negatives_per_trajectory}, "
        f"verify_mistakes {config.verify_mistakes}, shuffle_options {config.shuffle_options}",
        f"- random_action_prob {config.random_action_prob} (0: oracle trajectories with injected mistakes; > 0: the "
        "reference code's 'oracle + random p' behaviour), policy_targets "
        f"{config.policy_targets!r}",
        f"- stop marker `{STOP_MARKER}` ends every reflection target; policy targets are the "
        + (
            "oracle's option label" if config.policy_targets == "oracle" else "executed action's option label"
        ),
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
        f"Empty reflections: {stats.empty_reflections}. Tasks skipped because the environment's option settings "
        f"prune the oracle's next action (not solvable as configured): {sum(stats.unsolvable.values())}"
        + (
            f" ({', '.join(f'{sp}/{d}: {n}' for (sp, d), n in sorted(stats.unsolvable.items()))})"
            if stats.unsolvable
            else ""
        )
        + ".",
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
    lengths = lengths or length_stats(rows)
    unit = lengths.unit if lengths.unit == "characters" else f"tokens of `{lengths.tokenizer}`"
    lines += [
        "",
        "## Lengths",
        "",
        f"In {unit}, over the mixed data sets (both splits):",
        "",
        "| text | longest | 95th percentile | mean |",
        "|---|---|---|---|",
        f"| reflection target (stop marker included) | {lengths.reflection_max} | {lengths.reflection_p95} "
        f"| {lengths.reflection_mean} |",
        f"| reflection prompt | {lengths.reflection_prompt_max} | | |",
        f"| policy prompt with its reflection and label | {lengths.prompt_max} | | |",
        "",
        (
            f"`reflection_max_new_tokens` (SFT evaluation, RL, eval) must be at least {lengths.budget()}, or the "
            "longest reflections are cut before the stop marker; SFT's `max_length` must hold the longest prompt."
            if lengths.unit == "tokens"
            else f"`reflection_max_new_tokens` (SFT evaluation, RL, eval) must exceed the longest reflection in tokens "
            f"(about {lengths.budget()} at {CHARS_PER_TOKEN:g} characters per token); `reflect-trl data "
            "--tokenizer_name_or_path <your model>` counts them."
        ),
    ]
    lines += ["", "## Options", "", option_lists_summary(rows) + "."]
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
