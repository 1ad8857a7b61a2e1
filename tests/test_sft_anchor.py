"""The SFT anchor's rows (reflect_trl.sft_anchor) and its configuration."""

from __future__ import annotations

import json

import pytest

from _policy_data import write_policy_rows
from reflect_trl.datasets_io import DatasetFormatError
from reflect_trl.models import load_tokenizer
from reflect_trl.prompts import DEFAULT_LABELS, encode_prompts
from reflect_trl.replay import ReplayTurn
from reflect_trl.sft_anchor import AnchorSampler, load_anchor_rows
from reflect_trl.trainers.rl import ReflectPPOConfig


def test_rows_are_tokenized_like_rollout_prompts_with_the_target_position(tiny_model_dir, tmp_path):
    tokenizer = load_tokenizer(tiny_model_dir)
    rows = write_policy_rows(tmp_path / "p.jsonl")
    with (tmp_path / "p.jsonl").open("a") as handle:  # a validation row is not an anchor row
        handle.write(json.dumps(dict(rows[0], split="validation")) + "\n")
    anchor = load_anchor_rows(tmp_path / "p.jsonl", tokenizer, DEFAULT_LABELS)
    assert len(anchor) == 5
    assert [a.prompt_ids for a in anchor] == [
        tuple(x) for x in encode_prompts(tokenizer, [r["prompt"] for r in rows])
    ]
    assert [a.option for a in anchor] == [0, 1, 2, 3, 4]
    assert all(a.num_options == 6 for a in anchor)
    short = load_anchor_rows(tmp_path / "p.jsonl", tokenizer, DEFAULT_LABELS, max_prompt_length=10)
    assert all(
        len(a.prompt_ids) == 10 and a.prompt_ids == b.prompt_ids[-10:]
        for a, b in zip(short, anchor, strict=True)
    )


def test_bad_rows_name_file_row_and_field(tiny_model_dir, tmp_path):
    tokenizer = load_tokenizer(tiny_model_dir)
    path = tmp_path / "reflection.jsonl"
    path.write_text(json.dumps({"prompt": "s", "completion": " I move north.", "num_options": 6}) + "\n")
    with pytest.raises(
        DatasetFormatError, match=r"reflection.jsonl, train row 0: completion ' I move north.'"
    ):
        load_anchor_rows(path, tokenizer, DEFAULT_LABELS)
    path.write_text(json.dumps({"prompt": "s", "completion": " C"}) + "\n")
    with pytest.raises(DatasetFormatError, match="needs a 'num_options' column"):
        load_anchor_rows(path, tokenizer, DEFAULT_LABELS)
    path.write_text(json.dumps({"prompt": "s", "completion": " C", "num_options": 2}) + "\n")
    with pytest.raises(DatasetFormatError, match="train row 0: num_options=2 does not fit completion 'C'"):
        load_anchor_rows(path, tokenizer, DEFAULT_LABELS)


def test_sampler_is_seeded_and_resumes_from_its_state():
    rows = [ReplayTurn((i,), 0, 2, 0.0) for i in range(50)]
    a, b = AnchorSampler(rows, seed=7), AnchorSampler(rows, seed=7)
    assert a.sample(10) == b.sample(10)
    state = a.state_dict()
    ahead = a.sample(10)
    c = AnchorSampler(rows, seed=123)
    c.load_state_dict(json.loads(json.dumps(state)))  # survives a round trip through plain containers
    assert c.sample(10) == ahead
    with pytest.raises(ValueError, match="checkpoint's SFT anchor had 50 rows, sft_anchor_data now has 3"):
        AnchorSampler(rows[:3], seed=0).load_state_dict(state)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"sft_anchor_coef": 1.0}, "sft_anchor_coef=1.0 needs sft_anchor_data"),
        ({"sft_anchor_coef": -0.5, "sft_anchor_data": "x.jsonl"}, "sft_anchor_coef must be >= 0"),
        (
            {"sft_anchor_coef": 1.0, "sft_anchor_data": "x.jsonl", "sft_anchor_samples": 0},
            "sft_anchor_samples",
        ),
    ],
)
def test_config_checks_the_anchor_fields(fields, match):
    with pytest.raises(ValueError, match=match):
        ReflectPPOConfig(output_dir="/tmp/x", use_cpu=True, bf16=False, **fields)
