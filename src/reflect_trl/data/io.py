"""Reading, writing and validating the prompt/completion data sets of reflect-trl.

A data set is given by a path, one of

* a directory written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (what the data builder writes
  under ``data/<env>/<name>/``);
* a ``.jsonl`` file, one JSON object per line (the builder's human-readable copy ``data/<env>/<name>.jsonl``,
  whose rows carry a ``split`` field);
* a Hugging Face Hub data set id (``owner/name``), for real users with hub access.

Validation never drops anything silently: a line that is not valid JSON, a missing or empty required field, or a
field of the wrong type raises :class:`DatasetFormatError` naming the file, the line (JSONL, 1-based) or row
(0-based) and the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: Columns every SFT data set needs (TRL's prompt-completion format, so the loss covers the completion only).
REQUIRED_COLUMNS: tuple[str, ...] = ("prompt", "completion")
#: Column of the builder's JSONL files that says which split a row belongs to.
SPLIT_COLUMN = "split"


class DatasetFormatError(ValueError):
    """A data set file or row that does not have the expected format."""


# -- JSONL ---------------------------------------------------------------------------------------------------
def write_jsonl(records: Iterable[Mapping[str, Any]], path: str | Path) -> Path:
    """Write one JSON object per line (UTF-8, keys in insertion order, ``\\n`` line ends): byte-identical output
    for identical records."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Parse a JSONL file; every line must be a JSON object (only a final newline may be left empty)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"JSONL file {str(path)!r} does not exist")
    records: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as handle:
        lines = handle.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last record
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raise DatasetFormatError(
                f"{path}, line {number}: empty line (each line must hold one JSON object)"
            )
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DatasetFormatError(
                f"{path}, line {number}: invalid JSON ({err.msg} at column {err.colno}); "
                f"the line may be truncated: {line[:80]!r}{'...' if len(line) > 80 else ''}"
            ) from None
        if not isinstance(record, dict):
            raise DatasetFormatError(
                f"{path}, line {number}: expected a JSON object, got {type(record).__name__}"
            )
        records.append(record)
    return records


# -- validation ----------------------------------------------------------------------------------------------
def check_record(
    record: Mapping[str, Any], where: str, required_columns: Sequence[str] = REQUIRED_COLUMNS
) -> None:
    """Raise :class:`DatasetFormatError` (prefixed by ``where``) unless every required field is a non-empty
    string."""
    for column in required_columns:
        if column not in record:
            raise DatasetFormatError(f"{where}: missing field {column!r} (fields present: {sorted(record)})")
        value = record[column]
        if not isinstance(value, str):
            raise DatasetFormatError(
                f"{where}: field {column!r} must be a string, got {type(value).__name__} ({value!r:.60})"
            )
        if not value.strip():
            raise DatasetFormatError(f"{where}: field {column!r} is empty")


def validate_dataset(dataset, source: str, required_columns: Sequence[str] = REQUIRED_COLUMNS) -> None:
    """Check a ``datasets.Dataset``: the required columns exist and every row holds a non-empty string there.

    ``source`` names the data set in error messages (a path, or e.g. ``"train_dataset"``).
    """
    columns = list(dataset.column_names)
    missing = [c for c in required_columns if c not in columns]
    if missing:
        raise DatasetFormatError(
            f"{source}: missing column(s) {missing}; columns present: {columns}. reflect-trl SFT data uses the "
            "prompt/completion format (build it with `reflect-trl data`)"
        )
    for column in required_columns:
        for row, value in enumerate(dataset[column]):
            if not isinstance(value, str):
                raise DatasetFormatError(
                    f"{source}, row {row}: field {column!r} must be a string, got {type(value).__name__}"
                )
            if not value.strip():
                raise DatasetFormatError(f"{source}, row {row}: field {column!r} is empty")


# -- loading -------------------------------------------------------------------------------------------------
def _looks_like_hub_id(path: str) -> bool:
    from reflect_trl.validation import looks_like_local_path

    parts = path.split("/")
    return len(parts) == 2 and all(parts) and not looks_like_local_path(path) and not path.endswith(".jsonl")


def available_splits(path: str | Path) -> list[str]:
    """Splits of a local data set: the ``DatasetDict`` keys of a saved directory, the distinct ``split`` values
    of a JSONL file (``[]`` if the file has no ``split`` field), ``[]`` for a single saved ``Dataset``."""
    path = Path(path)
    if path.is_dir():
        if (path / "dataset_dict.json").is_file():
            return list(json.loads((path / "dataset_dict.json").read_text())["splits"])
        return []
    records = read_jsonl(path)
    return sorted({str(r[SPLIT_COLUMN]) for r in records if SPLIT_COLUMN in r})


def load_sft_dataset(
    path: str | Path,
    split: str = "train",
    required_columns: Sequence[str] = REQUIRED_COLUMNS,
):
    """Load and validate one split of a prompt/completion data set (see the module docstring for ``path``).

    A JSONL file whose rows have a ``split`` field yields the rows of ``split`` (without that field); a JSONL file
    without it, or a saved single ``Dataset``, is returned whole.
    """
    import datasets

    text = str(path)
    local = Path(text)
    if local.is_dir():
        if not (local / "dataset_dict.json").is_file() and not (local / "dataset_info.json").is_file():
            raise DatasetFormatError(
                f"{text} is a directory but not a saved data set (no dataset_dict.json or dataset_info.json); "
                "pass a directory written by `save_to_disk`, a .jsonl file or a hub id"
            )
        # In memory: later ``map`` calls (TRL's tokenization) then write no cache files into the data directory.
        loaded = datasets.load_from_disk(text, keep_in_memory=True)
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise DatasetFormatError(f"{text}: no split {split!r}; available splits: {list(loaded)}")
            dataset, source = loaded[split], f"{text} [{split}]"
        else:
            dataset, source = loaded, text
        validate_dataset(dataset, source, required_columns)
        return dataset
    if local.is_file() or text.endswith(".jsonl"):
        records = read_jsonl(local)
        has_split = [SPLIT_COLUMN in r for r in records]
        if any(has_split) and not all(has_split):
            line = has_split.index(False) + 1
            raise DatasetFormatError(
                f"{text}, line {line}: missing field {SPLIT_COLUMN!r} (other lines of this file have it)"
            )
        selected: list[tuple[int, dict[str, Any]]] = list(enumerate(records, start=1))
        if records and all(has_split):
            splits = sorted({str(r[SPLIT_COLUMN]) for r in records})
            if split not in splits:
                raise DatasetFormatError(f"{text}: no rows of split {split!r}; splits in the file: {splits}")
            selected = [(n, r) for n, r in selected if r[SPLIT_COLUMN] == split]
        if not selected:
            raise DatasetFormatError(f"{text}: the file holds no records")
        for number, record in selected:
            check_record(record, f"{text}, line {number}", required_columns)
        rows = [{k: v for k, v in r.items() if k != SPLIT_COLUMN} for _, r in selected]
        return datasets.Dataset.from_list(rows)
    if _looks_like_hub_id(text):
        dataset = datasets.load_dataset(text, split=split)
        validate_dataset(dataset, f"{text} [{split}]", required_columns)
        return dataset
    raise FileNotFoundError(
        f"data set {text!r} not found: expected a directory written by save_to_disk, a .jsonl file, "
        "or a hub id of the form owner/name"
    )


__all__ = [
    "REQUIRED_COLUMNS",
    "SPLIT_COLUMN",
    "DatasetFormatError",
    "available_splits",
    "check_record",
    "load_sft_dataset",
    "read_jsonl",
    "validate_dataset",
    "write_jsonl",
]


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
