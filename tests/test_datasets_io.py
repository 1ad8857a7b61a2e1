"""Loading and validating SFT data: precise errors, nothing dropped silently."""

from __future__ import annotations

import json

import pytest
from datasets import Dataset, DatasetDict

from reflect_trl.data.io import (
    DatasetFormatError,
    available_splits,
    load_sft_dataset,
    read_jsonl,
    validate_dataset,
    write_jsonl,
)

ROWS = [
    {"split": "train", "prompt": "state 1\n# Action:\n", "completion": "A", "step": 0},
    {"split": "train", "prompt": "state 2\n# Action:\n", "completion": "B", "step": 1},
    {"split": "validation", "prompt": "state 3\n# Action:\n", "completion": "C", "step": 0},
]


def write_lines(path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_jsonl_round_trip_and_split_selection(tmp_path):
    path = write_jsonl(ROWS, tmp_path / "d.jsonl")
    assert read_jsonl(path) == ROWS
    assert available_splits(path) == ["train", "validation"]
    train = load_sft_dataset(path, "train")
    assert train["completion"] == ["A", "B"]
    assert "split" not in train.column_names and train["step"] == [0, 1]
    assert load_sft_dataset(path, "validation")["prompt"] == ["state 3\n# Action:\n"]
    with pytest.raises(DatasetFormatError, match=r"no rows of split 'test'.*\['train', 'validation'\]"):
        load_sft_dataset(path, "test")


def test_jsonl_without_split_field_is_loaded_whole(tmp_path):
    path = write_jsonl([{k: v for k, v in r.items() if k != "split"} for r in ROWS], tmp_path / "d.jsonl")
    assert len(load_sft_dataset(path, "train")) == 3


def test_truncated_line_names_file_and_line(tmp_path):
    lines = [json.dumps(r) for r in ROWS]
    lines[1] = lines[1][:25]  # cut mid-record
    path = write_lines(tmp_path / "cut.jsonl", lines)
    with pytest.raises(DatasetFormatError, match=r"cut\.jsonl, line 2: invalid JSON .*truncated"):
        load_sft_dataset(path)


def test_missing_field_names_file_line_and_field(tmp_path):
    rows = [dict(r) for r in ROWS]
    del rows[2]["completion"]
    rows[2]["split"] = "train"
    path = write_jsonl(rows, tmp_path / "missing.jsonl")
    with pytest.raises(DatasetFormatError, match=r"missing\.jsonl, line 3: missing field 'completion'"):
        load_sft_dataset(path, "train")


def test_empty_and_mistyped_fields(tmp_path):
    rows = [dict(r) for r in ROWS]
    rows[1]["prompt"] = "   "
    path = write_jsonl(rows, tmp_path / "empty.jsonl")
    with pytest.raises(DatasetFormatError, match=r"empty\.jsonl, line 2: field 'prompt' is empty"):
        load_sft_dataset(path, "train")
    rows[1]["prompt"] = None
    path = write_jsonl(rows, tmp_path / "null.jsonl")
    with pytest.raises(DatasetFormatError, match=r"null\.jsonl, line 2: field 'prompt' must be a string"):
        load_sft_dataset(path, "train")


def test_blank_line_and_non_object_lines_are_errors(tmp_path):
    lines = [json.dumps(r) for r in ROWS]
    path = write_lines(tmp_path / "blank.jsonl", [lines[0], "", lines[1]])
    with pytest.raises(DatasetFormatError, match=r"blank\.jsonl, line 2: empty line"):
        load_sft_dataset(path)
    path = write_lines(tmp_path / "list.jsonl", [lines[0], "[1, 2]"])
    with pytest.raises(DatasetFormatError, match=r"list\.jsonl, line 2: expected a JSON object, got list"):
        load_sft_dataset(path)


def test_split_field_on_some_lines_only(tmp_path):
    rows = [dict(r) for r in ROWS]
    del rows[1]["split"]
    path = write_jsonl(rows, tmp_path / "mixed.jsonl")
    with pytest.raises(DatasetFormatError, match=r"mixed\.jsonl, line 2: missing field 'split'"):
        load_sft_dataset(path)


def test_saved_dataset_dict_and_missing_column(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "split"} for r in ROWS]
    DatasetDict(
        {"train": Dataset.from_list(rows[:2]), "validation": Dataset.from_list(rows[2:])}
    ).save_to_disk(str(tmp_path / "saved"))
    assert available_splits(tmp_path / "saved") == ["train", "validation"]
    assert load_sft_dataset(tmp_path / "saved", "validation")["completion"] == ["C"]
    with pytest.raises(DatasetFormatError, match=r"saved: no split 'test'; available splits"):
        load_sft_dataset(tmp_path / "saved", "test")
    Dataset.from_list([{"prompt": "p", "answer": "a"}]).save_to_disk(str(tmp_path / "bad"))
    with pytest.raises(DatasetFormatError, match=r"bad: missing column\(s\) \['completion'\]"):
        load_sft_dataset(tmp_path / "bad")


def test_validate_dataset_names_the_row():
    data = Dataset.from_list([{"prompt": "p", "completion": "A"}, {"prompt": "p", "completion": ""}])
    with pytest.raises(DatasetFormatError, match=r"train_dataset, row 1: field 'completion' is empty"):
        validate_dataset(data, "train_dataset")


def test_unknown_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_sft_dataset(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError, match="not found"):
        load_sft_dataset(str(tmp_path / "no" / "such" / "dir"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(DatasetFormatError, match="not a saved data set"):
        load_sft_dataset(tmp_path / "plain")
