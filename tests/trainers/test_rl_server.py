"""ReflectPPOTrainer with the reflection player behind a real OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from transformers import TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reflection"))

from _completions_server import Choice, CompletionsServer, scripted  # noqa: E402
from _openai_server import running  # noqa: E402
from test_rl_loss import make_trainer  # noqa: E402

from reflect_trl.reflection.remote import ReflectionServerError  # noqa: E402
from reflect_trl.trainers.rl_config import ReflectPPOConfig  # noqa: E402
from reflect_trl.trainers.rl_trainer import ReflectPPOTrainer  # noqa: E402


def _trainer(model_dir: str, out_dir: Path, base_url: str, **overrides) -> ReflectPPOTrainer:
    served = dict(
        reflection_backend="openai",
        reflection_base_url=base_url,
        reflection_server_model="tiny-reflector",
        reflection_max_new_tokens=8,
        reflection_timeout=2.0,
        reflection_max_retries=1,
        log_episodes_every=1,
    )
    return make_trainer(model_dir, out_dir, reflection_tokenizer=True, **{**served, **overrides})


def test_rl_reads_reflections_from_the_server(tiny_model_dir, tmp_path):
    with running(CompletionsServer(scripted(Choice("I should move north.", "stop", 5)))) as srv:
        trainer = _trainer(tiny_model_dir, tmp_path, srv.base_url)
        trainer.train()
    assert srv.log.requests > 0
    turns = [
        t
        for f in (tmp_path / "episodes").glob("*.jsonl")
        for line in f.read_text().splitlines()
        for t in __import__("json").loads(line)["turns"]
    ]
    assert turns and all(t["reflection"] == "I should move north." for t in turns)
    assert trainer.state.global_step == 3


def test_server_failure_writes_a_checkpoint_and_names_it(tiny_model_dir, tmp_path):
    server = CompletionsServer(scripted(Choice("I should move north.", "stop", 5)))

    class BreakServerAfterStep1(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:
                server.faults = [500] * 1000  # every later request fails

    with running(server) as srv:
        trainer = _trainer(tiny_model_dir, tmp_path, srv.base_url)
        trainer.add_callback(BreakServerAfterStep1())
        with pytest.raises(ReflectionServerError) as info:
            trainer.train()
    message = str(info.value)
    checkpoint = tmp_path / "checkpoint-1"
    assert srv.base_url in message or srv.base_url in str(info.value.url)
    assert str(checkpoint) in message and "global step 1" in message
    assert (checkpoint / "reflect_state_rank0.pt").is_file() and (checkpoint / "optimizer.pt").is_file()
    # The checkpoint resumes once the server is back.
    with running(CompletionsServer(scripted(Choice("I should move north.", "stop", 5)))) as srv:
        resumed = _trainer(tiny_model_dir, tmp_path, srv.base_url)
        resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 3


def test_openai_backend_needs_a_url():
    with pytest.raises(ValueError, match="reflection_base_url"):
        ReflectPPOConfig(output_dir="/tmp/x", use_cpu=True, bf16=False, reflection_backend="openai")
    with pytest.raises(ValueError, match="reflection_backend='vllm'"):
        ReflectPPOConfig(output_dir="/tmp/x", use_cpu=True, bf16=False, reflection_backend="vllm")


def test_eval_reads_reflections_from_the_server(tiny_model_dir, tmp_path):
    from reflect_trl.evaluation import EvalConfiguration, EvalSettings, evaluate

    with running(CompletionsServer(scripted(Choice("I should move north.", "stop", 5)))) as srv:
        settings = EvalSettings(
            episodes_per_stage=2,
            stages=["pickup"],
            decodings=["greedy"],
            reflection_backend="openai",
            reflection_base_url=srv.base_url,
            reflection_max_new_tokens=8,
        )
        report = evaluate(
            [EvalConfiguration("served", tiny_model_dir, "tiny-reflector")], settings, progress=False
        )
    turns = [t for records in report.transcripts.values() for ep in records for t in ep["turns"]]
    assert turns and all(t["reflection"] == "I should move north." for t in turns)
    assert srv.log.requests == len(turns)
    assert report.to_json()["environment"]["env"] == "taxi"
