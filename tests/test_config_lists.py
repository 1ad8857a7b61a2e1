"""List-valued settings accept YAML/JSON lists and comma-separated strings alike, in every config."""

from __future__ import annotations

import argparse

import pytest

from reflect_trl.config_lists import parse_int_list, parse_list

SPELLINGS = [
    "pickup,dropoff",
    " pickup , dropoff ",
    '["pickup", "dropoff"]',
    ["pickup", "dropoff"],
    ["pickup,dropoff"],
]


@pytest.mark.parametrize("value", SPELLINGS)
def test_parse_list_spellings(value):
    assert parse_list(value, "stages") == ["pickup", "dropoff"]


def test_parse_list_edge_cases():
    assert parse_list(None) is None and parse_list("") is None and parse_list([]) is None
    assert parse_int_list("0, 10,20", "starts") == [0, 10, 20] and parse_int_list([0, "5"]) == [0, 5]
    with pytest.raises(ValueError, match=r"stages: '\[pickup' is not a valid JSON list"):
        parse_list("[pickup", "stages")
    with pytest.raises(ValueError, match="starts: expected integers"):
        parse_int_list("1,two", "starts")


@pytest.mark.parametrize("value", SPELLINGS)
def test_every_config_reads_every_spelling(value):
    from reflect_trl.data.builder import DataBuilderConfig
    from reflect_trl.evaluation import EvalSettings
    from reflect_trl.trainers.rl_config import ReflectPPOConfig
    from reflect_trl.trainers.sft_config import ReflectSFTConfig

    cpu = {"output_dir": "unused", "use_cpu": True, "bf16": False, "report_to": "none"}
    assert ReflectPPOConfig(**cpu, curriculum_stages=value).curriculum_stages == ["pickup", "dropoff"]
    assert ReflectSFTConfig(**cpu, stages=value).stages == ["pickup", "dropoff"]
    assert DataBuilderConfig(stages=value).stages == ["pickup", "dropoff"]
    assert EvalSettings(stages=value).stages == ["pickup", "dropoff"]


def test_eval_decodings_and_rl_stage_starts():
    from reflect_trl.evaluation import EvalSettings
    from reflect_trl.trainers.rl_config import ReflectPPOConfig

    assert EvalSettings(decodings="greedy").decodings == ["greedy"]
    assert EvalSettings(decodings='["sampled", "greedy"]').decodings == ["sampled", "greedy"]
    starts = ReflectPPOConfig(
        output_dir="unused", use_cpu=True, bf16=False, curriculum_stage_starts=["0,4", "8"]
    )
    assert starts.curriculum_stage_starts == [0, 4, 8]


def test_cli_flags_take_both_spellings(tmp_path):
    from trl import ModelConfig, TrlParser

    from reflect_trl.cli.demo import parse_demo_overrides
    from reflect_trl.pipelines.demo import DemoConfig
    from reflect_trl.trainers.rl_config import ReflectPPOConfig

    parser = TrlParser((ReflectPPOConfig, ModelConfig))
    for flags in (["pickup,dropoff"], ["pickup", "dropoff"], ['["pickup","dropoff"]']):
        args, _ = parser.parse_args_and_config(
            ["--output_dir", str(tmp_path), "--use_cpu", "--bf16", "false", "--curriculum_stages", *flags]
        )
        assert args.curriculum_stages == ["pickup", "dropoff"], flags
    demo = argparse.ArgumentParser()
    for value in ("greedy,sampled", '["greedy", "sampled"]'):
        assert parse_demo_overrides(["--eval_decodings", value], demo)["eval_decodings"] == [
            "greedy",
            "sampled",
        ]
    assert DemoConfig().eval_decodings == ["greedy", "sampled"]  # both, so sharpening shows as such
