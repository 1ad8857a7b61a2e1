"""Option-lookup warm-up data (reflect_trl.data.lookup, ``reflect-trl lookup-data``)."""

from __future__ import annotations

import json

import pytest

from _toy_env import LineWorldEnv, LineWorldReflector
from reflect_trl.cli import main
from reflect_trl.data.builder import DataBuilderConfig, build_datasets
from reflect_trl.data.io import load_sft_dataset, read_jsonl
from reflect_trl.data.lookup import lookup_rows, write_lookup_dataset
from reflect_trl.prompts import (
    LABELS_FILE,
    REFLECTION_HEADER,
    build_prompt,
    prompt_options,
    read_option_labels,
    write_option_labels,
)

ACTIONS = ("go north", "go south", "take key", "open door", "look")


def row(split: str, target: int, labels: str = "ABCDE") -> dict:
    prompt = build_prompt(
        "You are in a hall.", ACTIONS, f"I should {ACTIONS[target]} now.", labels=labels
    ).text
    return {
        "split": split,
        "prompt": prompt,
        "completion": labels[target],
        "num_options": 5,
        "option_index": target,
    }


def answer(r: dict, labels: str = "ABCDE") -> str:
    return prompt_options(r["prompt"])[labels.index(r["completion"])]


def test_rows_keep_the_reflection_and_the_answer_but_not_the_state():
    rows = [row("train", 2), row("train", 0), row("validation", 3)]
    out = lookup_rows(rows, copies=4, seed=0)
    assert [len(out["train"]), len(out["validation"])] == [8, 1]
    assert [answer(r) for r in out["train"]] == ["take key"] * 4 + ["go north"] * 4
    for r in out["train"] + out["validation"]:
        assert (
            r["prompt"].startswith(REFLECTION_HEADER + "I should ") and "You are in a hall" not in r["prompt"]
        )
        assert r["prompt"].endswith("# Action:\n") and sorted(prompt_options(r["prompt"])) == sorted(ACTIONS)
        assert r["option_index"] == "ABCDE".index(r["completion"])
    assert len({prompt_options(r["prompt"]) for r in out["train"]}) > 2, "the orders change"
    assert lookup_rows(rows, 4, seed=0) == out and lookup_rows(rows, 4, seed=1) != out


def test_custom_labels_and_a_bad_target_are_handled():
    out = lookup_rows([row("train", 1, labels="pqrst")], copies=3, seed=0, labels="pqrst")
    assert all(answer(r, "pqrst") == "go south" for r in out["train"])
    with pytest.raises(
        ValueError, match=r"row 0 \(train\): completion 'Z' is not one of the 5 option labels"
    ):
        lookup_rows([dict(row("train", 1), completion="Z")], copies=1)
    with pytest.raises(ValueError, match="copies must be >= 1"):
        lookup_rows([row("train", 1)], copies=0)


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("lookup")
    config = DataBuilderConfig(
        env_name="line_world", n_train_tasks=6, n_val_tasks=2, seed=3, output_dir=str(root), progress=False
    )
    build_datasets(config, env=LineWorldEnv(), reflector=LineWorldReflector())
    return root / "line_world"


def test_the_command_writes_a_data_set_that_sft_can_read(toy_data, capsys):
    sizes = main(["lookup-data", "--dataset", str(toy_data / "policy_reflect.jsonl"), "--output",
                  str(toy_data / "policy_lookup"), "--copies", "3"])  # fmt: skip
    assert sizes == 0
    source = read_jsonl(toy_data / "policy_reflect.jsonl")
    written = read_jsonl(toy_data / "policy_lookup.jsonl")
    per_split = {s: sum(r["split"] == s for r in source) for s in ("train", "validation")}
    assert sum(r["split"] == "train" for r in written) == 3 * per_split["train"]
    assert sum(r["split"] == "validation" for r in written) == per_split["validation"]
    train = load_sft_dataset(toy_data / "policy_lookup", "train")
    assert len(train) == 3 * per_split["train"] and train[0]["prompt"].startswith(REFLECTION_HEADER)
    assert (
        f"[lookup-data] {toy_data / 'policy_lookup'} (train {3 * per_split['train']}"
        in capsys.readouterr().out
    )
    # the same from the saved directory, and again over its own earlier output
    assert write_lookup_dataset(toy_data / "policy_reflect", toy_data / "policy_lookup", copies=3) == {
        "train": 3 * per_split["train"],
        "validation": per_split["validation"],
    }


def test_the_data_labels_are_used_and_copied(tmp_path):
    data = tmp_path / "data" / "env"
    data.mkdir(parents=True)
    write_option_labels(data, "pqrst")
    rows = [row("train", 4, labels="pqrst"), row("validation", 2, labels="pqrst")]
    (data / "policy_reflect.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_lookup_dataset(data / "policy_reflect.jsonl", tmp_path / "out" / "policy_lookup", copies=2)
    assert read_option_labels(tmp_path / "out") == tuple("pqrst")
    written = read_jsonl(tmp_path / "out" / "policy_lookup.jsonl")
    assert [answer(r, "pqrst") for r in written] == ["look", "look", "take key"]
    assert (tmp_path / "out" / LABELS_FILE).is_file()


def test_plain_policy_data_and_a_foreign_output_are_refused(toy_data, tmp_path, capsys):
    status = main(
        ["lookup-data", "--dataset", str(toy_data / "policy_plain.jsonl"), "--output", str(tmp_path / "x")]
    )
    assert status == 2 and "--dataset" in capsys.readouterr().err and not (tmp_path / "x").exists()
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "keep.txt").write_text("mine")
    status = main(["lookup-data", "--dataset", str(toy_data / "policy_reflect.jsonl"), "--output",
                   str(tmp_path / "foreign")])  # fmt: skip
    assert status == 2 and "is not a saved data set" in capsys.readouterr().err
    assert (tmp_path / "foreign" / "keep.txt").read_text() == "mine"
