"""benchmarks/gpu_check.py in its CPU dry run (tiny shapes, a few tokens): the same code the GPU run takes, so the
script cannot rot. Checks what it writes (JSON and markdown), not how fast the CPU is."""

from __future__ import annotations

import json
import math

import pytest

from _benchmarks import load_benchmark

MODELS = ("gpt2-xl", "llama-1b")
SPLIT = (
    "reflection_generation_s",
    "policy_scoring_s",
    "loss_backward_s",
    "env_tokenize_s",
    "optimizer_other_s",
)


@pytest.fixture(scope="module")
def check():
    """benchmarks/gpu_check.py, imported as a module."""
    load_benchmark("rollout_throughput")  # gpu_check imports its sibling by name
    return load_benchmark("gpu_check")


def _positive(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def dry_run(check, tiny_model_dir, tmp_path_factory):
    """One dry run of both model shapes with the CUDA tests (all skipped on the CPU): exit status and outputs."""
    out = tmp_path_factory.mktemp("gpu_check")
    status = check.main(["--dry-run", "--output_dir", str(out), "--tokenizer_dir", tiny_model_dir])
    return status, json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text(), out


def test_dry_run_passes_and_reports_every_part(dry_run):
    status, record, _, out = dry_run
    assert status == 0 and record["exit_status"] == 0
    assert record["dry_run"] is True and record["models"] == list(MODELS)
    expected = {"cuda_tests"} | {f"{k}:{m}" for m in MODELS for k in ("reflect", "grpo")}
    assert set(record["parts"]) == expected
    assert all(p["status"] == "ok" and p["seconds"] >= 0 for p in record["parts"].values())
    tests = record["parts"]["cuda_tests"]["result"]
    assert tests["skipped"] > 0 and tests["passed"] == tests["failed"] == tests["errors"] == 0, "no CUDA here"
    assert (out / "cuda_tests.xml").is_file() and (out / "cuda_tests.log").is_file()
    settings = record["settings"]
    assert settings["recipe"].endswith("recipes/taxi/rl.yaml") and settings["reflection_bits"] == 8
    assert record["machine"]["packages"]["trl"] and record["machine"]["device"] == "cpu"


def test_reflect_rl_step_is_split_into_positive_parts(dry_run):
    _, record, _, _ = dry_run
    settings = record["settings"]
    for name in MODELS:
        result = record["parts"][f"reflect:{name}"]["result"]
        timing = result["timing"]
        assert result["steps_run"] == (settings["warmup_cycles"] + settings["timed_cycles"]) * 2
        assert timing["timed_steps"] == settings["timed_cycles"] * settings["num_iterations"]
        for key in ("step_s", "reflection_generation_s", "loss_backward_s", "generated_tokens_per_s"):
            assert _positive(timing[key]), (name, key, timing[key])
        assert all(timing[k] >= -1e-6 for k in SPLIT), timing
        assert sum(timing[k] for k in SPLIT) == pytest.approx(timing["step_s"], rel=1e-6, abs=1e-9)
        # every rollout writes episodes x turns reflections of at most the budget
        per_rollout = settings["episodes"] * settings["turns"]
        assert timing["env_steps_per_step"] * settings["num_iterations"] == per_rollout
        tokens = timing["generated_tokens_per_step"] * settings["num_iterations"]
        assert per_rollout <= tokens <= per_rollout * settings["reflection_tokens"]
        assert tokens == timing["rollout_reflection_tokens_per_step"] * settings["num_iterations"]
        assert result["reflection_quantization"] == "8-bit" and result["policy_params"] > 0
        assert result["trainable_params"] < result["policy_params"], "LoRA: only the adapter trains"
        assert result["memory"]["peak_gib"] is None  # no GPU memory on the CPU
        assert timing["loss_batch"], "the loss micro-batch's shape is recorded"
        probe = result["loss_probe"]  # one micro-batch of the recipe's episodes x horizon turns
        assert probe["rows"] == settings["episodes"] * settings["recipe_horizon"] == 4 * 20
        assert _positive(probe["seconds"]) and probe["width"] > 0


def test_grpo_anchor_generates_as_many_tokens_and_gives_finite_ratios(dry_run):
    _, record, _, _ = dry_run
    for name in MODELS:
        grpo = record["parts"][f"grpo:{name}"]["result"]
        ours = record["parts"][f"reflect:{name}"]["result"]
        assert grpo["trainer"] == "trl.GRPOTrainer" and "use_vllm=False" in grpo["generation"]
        assert grpo["max_completion_length"] == record["settings"]["reflection_tokens"]
        for key in ("step_s", "generation_s", "seconds_per_generated_token", "loss_backward_s"):
            assert _positive(grpo["timing"][key]), (name, key)
        ratio = record["ratios"][name]
        for key in ("step_time_ours_over_grpo", "time_per_generated_token_ours_over_grpo"):
            assert _positive(ratio[key]), (name, key, ratio)
        assert ratio["step_time_ours_over_grpo"] == pytest.approx(
            ours["timing"]["step_s"] / grpo["timing"]["step_s"]
        )
        # the same number of generated tokens per step, from prompts of the same length
        assert ratio["generated_tokens_per_step_ours_over_grpo"] == pytest.approx(1.0, rel=0.25)
        assert ratio["prompt_tokens_ours_over_grpo"] == pytest.approx(1.0, rel=0.1)


def test_markdown_holds_the_tables_and_says_it_is_a_dry_run(dry_run):
    _, record, markdown, _ = dry_run
    assert "Dry run on the CPU" in markdown and "no figure here is a GPU measurement" in markdown
    assert "## CUDA tests" in markdown and "## Anchor: stock `trl.GRPOTrainer`" in markdown
    assert "## Failures" not in markdown and "at the recipe's horizon" in markdown
    for name in MODELS:
        rows = [line for line in markdown.splitlines() if line.startswith(f"| {name} |")]
        assert len(rows) == 2, rows  # one row in each table
        ratio = record["ratios"][name]["time_per_generated_token_ours_over_grpo"]
        assert f"**{ratio:.2f}**" in rows[1]


def test_a_failed_part_is_recorded_and_exits_non_zero(check, tiny_model_dir, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(check, "measure_grpo", broken)
    argv = ["--dry-run", "--skip_cuda_tests", "--models", "gpt2-xl", "--output_dir", str(tmp_path)]
    assert check.main([*argv, "--tokenizer_dir", tiny_model_dir]) == 1
    record = json.loads((tmp_path / "gpu_check.json").read_text())
    assert record["exit_status"] == 1
    assert record["parts"]["reflect:gpt2-xl"]["status"] == "ok"
    failed = record["parts"]["grpo:gpt2-xl"]
    assert failed["status"] == "failed" and "illegal memory access" in failed["error"]
    assert "gpt2-xl" not in record["ratios"]
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert "## Failures" in markdown and "illegal memory access" in markdown


def test_an_exhausted_budget_fails_the_run_without_measuring(check, tiny_model_dir, tmp_path):
    argv = ["--dry-run", "--skip_cuda_tests", "--budget_s", "0", "--output_dir", str(tmp_path)]
    assert check.main([*argv, "--tokenizer_dir", tiny_model_dir]) == 1
    record = json.loads((tmp_path / "gpu_check.json").read_text())
    assert {p["status"] for p in record["parts"].values()} == {"budget"}
    assert set(record["parts"]) == {f"{k}:{m}" for m in MODELS for k in ("reflect", "grpo")}


def test_make_target_writes_to_outputs_gpu_check_and_passes_args():
    import subprocess

    from _benchmarks import BENCHMARKS

    def dry(*variables: str) -> str:
        # --no-print-directory: under `make test` the inherited MAKELEVEL would add "Entering directory" lines
        command = ["make", "-n", "--no-print-directory", "gpu-check", *variables]
        return subprocess.run(
            command, cwd=BENCHMARKS.parent, capture_output=True, text=True, check=True
        ).stdout

    assert "benchmarks/gpu_check.py --output_dir outputs/gpu_check" in dry()
    assert dry("ARGS=--dry-run", "GPU_CHECK_DIR=/tmp/x").strip().endswith("--output_dir /tmp/x --dry-run")
    assert dry("GPU_PY=python3").startswith("python3 benchmarks/gpu_check.py")


def test_without_cuda_the_real_run_refuses_to_start(check, tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs the real check")
    assert check.main(["--output_dir", str(tmp_path)]) == 2
    assert "--dry-run" in capsys.readouterr().err
