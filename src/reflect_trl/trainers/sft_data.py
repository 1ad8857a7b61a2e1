"""Checks of SFT data before training: required columns, non-empty fields, completions that fit the ``role``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from datasets import Dataset, IterableDataset

from reflect_trl.data.io import REQUIRED_COLUMNS, DatasetFormatError, validate_dataset
from reflect_trl.prompts import ACTION_CUE, OPTIONS_HEADER, REFLECTION_HEADER, STOP_MARKER


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


def check_sft_dataset(dataset: Any, source: str, role: str, labels: Sequence[str]) -> None:
    """Check a train/eval data set (a ``Dataset``, an ``IterableDataset``, a dict of them, or None) for ``role``;
    pre-tokenized data (``input_ids`` without ``prompt``) is left to TRL."""
    if dataset is None:
        return
    if isinstance(dataset, dict):
        for name, part in dataset.items():
            check_sft_dataset(part, f"{source}[{name!r}]", role, labels)
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
    check_role_data(dataset, source, role, labels)


__all__ = ["check_role_data", "check_sft_dataset", "count_options"]
