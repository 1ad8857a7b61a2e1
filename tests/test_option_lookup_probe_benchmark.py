"""benchmarks/option_lookup_probe.py: the dataset variants it trains on (no SFT run here)."""

from __future__ import annotations

import json
import random
import re
import sys

import pytest

from _benchmarks import load_benchmark
from reflect_trl.prompts import build_prompt

probe = load_benchmark("option_lookup_probe")
ACTIONS = ["go north", "go south", "take key", "open door", "look"]


def row(split: str, target: int, reflection: str = 'I should "take key" now.') -> dict:
    prompt = build_prompt("You are in a hall.", ACTIONS, reflection).text
    return {"split": split, "prompt": prompt, "completion": "ABCDE"[target], "num_options": len(ACTIONS)}


def answer(r: dict) -> str:
    """The option text the row's label points at."""
    _, options, _ = probe.split_prompt(r["prompt"])
    return options["ABCDE".index(r["completion"])]


@pytest.fixture
def rows() -> list[dict]:
    return [row("train", 2), row("train", 0, 'Go "go north".'), row("validation", 2)]


def test_split_and_render_give_back_the_prompt_exactly(rows):
    for r in rows:
        assert probe.render(*probe.split_prompt(r["prompt"])) == r["prompt"]
    assert probe.split_prompt(rows[0]["prompt"])[1] == ACTIONS


def test_keep_leaves_every_row_as_it_is(rows):
    out = probe.variant_rows(rows, "keep", copies=3, seed=0)
    assert out["train"] == rows[:2] and out["validation"] == rows[2:]


def test_shuffle_moves_each_label_with_its_option(rows):
    out = probe.variant_rows(rows, "shuffle", copies=3, seed=0)
    assert [len(out["train"]), len(out["validation"])] == [2, 1]
    shuffled = out["train"] + out["validation"]
    assert [answer(r) for r in shuffled] == ["take key", "go north", "take key"]
    assert all(sorted(probe.split_prompt(r["prompt"])[1]) == sorted(ACTIONS) for r in shuffled)
    orders = {
        tuple(probe.split_prompt(r["prompt"])[1])
        for r in probe.variant_rows(rows * 10, "shuffle", 0, 1)["train"]
    }
    assert len(orders) > 1  # the order really changes from row to row


def test_augment_adds_shuffled_copies_of_train_rows_only(rows):
    out = probe.variant_rows(rows, "augment", copies=3, seed=0)
    assert len(out["train"]) == 2 * (1 + 3) and out["validation"] == rows[2:]
    assert [answer(r) for r in out["train"]] == ["take key"] * 4 + ["go north"] * 4
    assert out["train"][0] == rows[0]


def test_shuffle_copies_shuffles_every_row_and_copies_train_rows(rows):
    out = probe.variant_rows(rows, "shuffle_copies", copies=3, seed=0)
    assert [len(out["train"]), len(out["validation"])] == [6, 1]
    assert [answer(r) for r in out["train"]] == ["take key"] * 3 + ["go north"] * 3
    assert (
        "You are in a hall" in out["validation"][0]["prompt"] and answer(out["validation"][0]) == "take key"
    )
    orders = {tuple(probe.split_prompt(r["prompt"])[1]) for r in out["train"] + out["validation"]}
    assert len(orders) > 1


def test_no_state_keeps_only_the_reflection_and_the_options(rows):
    out = probe.variant_rows(rows, "no_state", copies=2, seed=0)
    assert [len(out["train"]), len(out["validation"])] == [4, 1]
    for r in out["train"] + out["validation"]:
        assert r["prompt"].startswith("# Reflection:\n") and "You are in a hall" not in r["prompt"]
    assert answer(out["validation"][0]) == "take key"


def test_variants_are_seeded(rows):
    first, again = (probe.variant_rows(rows, "augment", 4, seed=7) for _ in range(2))
    assert first == again
    assert probe.variant_rows(rows, "augment", 4, seed=8) != first
    random.seed(0)  # the module's draws do not come from the global RNG
    assert probe.variant_rows(rows, "augment", 4, seed=7) == first


@pytest.mark.slow
def test_the_probe_fine_tunes_each_variant_and_prints_its_option_accuracy(
    tiny_llama_dir, tmp_path, monkeypatch, capsys
):
    rows = [row("train", i % 5) for i in range(8)] + [row("validation", 2) for _ in range(4)]
    data = tmp_path / "policy_reflect.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "probe"
    argv = [str(data), "--model", tiny_llama_dir, "--variants", "keep", "shuffle", "--steps", "2"]
    sft_args = ["--", "--per_device_train_batch_size", "4"]  # after a lone --: passed on to every sft run
    monkeypatch.setattr(sys, "argv", ["option_lookup_probe.py", *argv, "--output_dir", str(out), *sft_args])
    probe.main()
    table = capsys.readouterr().out
    assert "(chance 20.0 %)" in table
    for variant in ("keep", "shuffle"):
        metrics = json.loads((out / variant / "run" / "sft_metrics.json").read_text())
        assert re.search(rf"\| {variant} \| 8 \| {100 * metrics['eval_option_accuracy']:.1f} % \|", table)
        assert "`per_device_train_batch_size`: 4" in (out / variant / "run" / "README.md").read_text()


def test_a_failed_sft_run_stops_the_probe_naming_its_log(tmp_path, monkeypatch):
    data = tmp_path / "policy_reflect.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [row("train", 0), row("validation", 2)]))
    missing = str(tmp_path / "no-such-model")
    out = tmp_path / "probe"
    argv = [str(data), "--model", missing, "--variants", "keep", "--steps", "1", "--output_dir", str(out)]
    monkeypatch.setattr(sys, "argv", ["option_lookup_probe.py", *argv])
    with pytest.raises(SystemExit, match=re.escape(f"variant 'keep' failed: see {out / 'keep' / 'sft.log'}")):
        probe.main()
    assert "no-such-model" in (out / "keep" / "sft.log").read_text()
