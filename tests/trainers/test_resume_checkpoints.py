"""``--resume_from_checkpoint``: ``true`` resumes from the newest *complete* checkpoint of output_dir, a partial one
(a run killed while it wrote it) is skipped with a warning, naming one is a clear error, and so is a missing path;
for ``reflect-trl rl`` and ``reflect-trl sft`` (reflect_trl.trainers.checkpoints)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_sft import toy  # noqa: F401 (the toy data and model of the SFT tests)

from reflect_trl.cli import main
from reflect_trl.errors import MissingPathError, UsageError
from reflect_trl.trainers.checkpoints import missing_parts, resolve_resume_from_checkpoint

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tests/trainers/kill_during_save_script.py"
RL_FILES = ["reflect_state_rank0.pt", "reflect_trl_labels.json"]


def _checkpoint(run: Path, step: int, *, without: tuple[str, ...] = (), extra=RL_FILES) -> Path:
    """A checkpoint folder with Trainer's files and ``extra``, less ``without``."""
    folder = run / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    files = ["model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"]
    files += list(extra)
    for name in files:
        if name not in without:
            content = json.dumps({"global_step": step}) if name == "trainer_state.json" else "x"
            (folder / name).write_text(content)
    return folder


@pytest.mark.parametrize("value", ["true", "True", "1", "yes", True])
def test_true_resumes_from_the_newest_complete_checkpoint_and_names_the_skipped_one(tmp_path, caplog, value):
    _checkpoint(tmp_path, 10)
    older = _checkpoint(tmp_path, 20)
    partial = _checkpoint(tmp_path, 30, without=("trainer_state.json", "rng_state.pth"))
    with caplog.at_level(logging.WARNING, logger="reflect_trl.trainers.checkpoints"):
        got = resolve_resume_from_checkpoint(value, tmp_path, required=RL_FILES)
    assert got == str(older)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert str(partial) in warnings[0] and "trainer_state.json" in warnings[0] and str(older) in warnings[0]


def test_partial_means_anything_a_resume_reads_is_missing(tmp_path):
    complete = _checkpoint(tmp_path, 1)
    assert missing_parts(complete, RL_FILES) == []
    assert missing_parts(_checkpoint(tmp_path, 2, without=("reflect_state_rank0.pt",)), RL_FILES) == [
        "reflect_state_rank0.pt"
    ]
    assert missing_parts(_checkpoint(tmp_path, 3, without=("model.safetensors",)), RL_FILES) == [
        "the model weights"
    ]
    assert missing_parts(_checkpoint(tmp_path, 4, without=("optimizer.pt",)), RL_FILES) == [
        "the optimizer/scheduler state"
    ]
    # save_only_model: no optimizer state is saved, none is needed
    model_only = _checkpoint(tmp_path, 5, without=("optimizer.pt",))
    assert missing_parts(model_only, RL_FILES, needs_optimizer=False) == []
    truncated = _checkpoint(tmp_path, 6)
    (truncated / "trainer_state.json").write_text('{"global_step": 6, "log_hi')  # killed mid-write
    assert missing_parts(truncated, RL_FILES) == ["a readable trainer_state.json"]


def test_naming_a_partial_checkpoint_names_the_last_complete_one(tmp_path):
    older = _checkpoint(tmp_path, 2)
    partial = _checkpoint(tmp_path, 4, without=("trainer_state.json",))
    with pytest.raises(UsageError) as err:
        resolve_resume_from_checkpoint(str(partial), tmp_path, required=RL_FILES)
    message = str(err.value)
    assert "\n" not in message and str(partial) in message and "trainer_state.json" in message
    assert f"the last complete checkpoint is {older}" in message
    # none complete: it says so
    (older / "trainer_state.json").unlink()
    with pytest.raises(UsageError, match="holds no complete checkpoint"):
        resolve_resume_from_checkpoint(str(partial), tmp_path, required=RL_FILES)
    with pytest.raises(UsageError, match=r"no complete checkpoint in output_dir .*checkpoint-4 lacks"):
        resolve_resume_from_checkpoint("true", tmp_path, required=RL_FILES)


def test_missing_path_and_no_resume(tmp_path):
    with pytest.raises(MissingPathError, match=r"resume_from_checkpoint '.*checkpoint-7' does not exist"):
        resolve_resume_from_checkpoint(str(tmp_path / "checkpoint-7"), tmp_path)
    with pytest.raises(UsageError, match="does not exist, so there is no checkpoint"):
        resolve_resume_from_checkpoint("true", tmp_path / "never-ran")
    for value in (None, False, "false", "no", "0"):
        assert resolve_resume_from_checkpoint(value, tmp_path) is None
    complete = _checkpoint(tmp_path, 3)
    assert resolve_resume_from_checkpoint(str(complete), tmp_path, required=RL_FILES) == str(complete)


def test_rl_command_refuses_a_partial_checkpoint_in_one_line(tiny_model_dir, tmp_path, capsys):
    """Before any model is loaded: the error names the partial checkpoint and the last complete one."""
    out = tmp_path / "rl"
    older = _checkpoint(out, 2)
    partial = _checkpoint(out, 4, without=("trainer_state.json", "reflect_state_rank0.pt"))
    argv = [
        "rl", "--model_name_or_path", tiny_model_dir, "--output_dir", str(out), "--use_cpu", "--bf16", "false",
        "--report_to", "none", "--max_steps", "4",
    ]  # fmt: skip
    capsys.readouterr()
    assert main([*argv, "--resume_from_checkpoint", str(partial)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert "partial checkpoint" in lines[0] and str(partial) in lines[0] and str(older) in lines[0]
    assert main([*argv, "--resume_from_checkpoint", str(out / "checkpoint-9")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"{out / 'checkpoint-9'}' does not exist" in lines[0], lines


def _sft_argv(toy, out: Path, *extra: str) -> list[str]:  # noqa: F811
    data_file = toy["root"] / "data" / "line_world" / "policy_reflect.jsonl"
    return [
        "sft",
        "--model_name_or_path", toy["model"],
        "--dataset_path", str(data_file),
        "--output_dir", str(out),
        "--per_device_train_batch_size", "8",
        "--report_to", "none",
        "--use_cpu", "--bf16", "false",
        "--eval_strategy", "no",
        "--save_strategy", "steps", "--save_steps", "2",
        "--logging_steps", "1",
        "--eval_num_policy_samples", "4",
        *extra,
    ]  # fmt: skip


def test_sft_true_skips_a_checkpoint_without_trainer_state(toy, tmp_path, monkeypatch, caplog, capsys):  # noqa: F811
    from reflect_trl.trainers.sft_trainer import ReflectSFTTrainer

    out = tmp_path / "sft"
    assert main(_sft_argv(toy, out, "--max_steps", "4")) == 0
    # as a run killed while writing checkpoint-4 leaves it
    (out / "checkpoint-4" / "trainer_state.json").unlink()

    # naming the partial checkpoint: one line naming the last complete one
    capsys.readouterr()
    partial = str(out / "checkpoint-4")
    assert main(_sft_argv(toy, out, "--max_steps", "6", "--resume_from_checkpoint", partial)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"the last complete checkpoint is {out / 'checkpoint-2'}" in lines[0], lines

    resumed_from = []
    train = ReflectSFTTrainer.train

    def recording_train(self, resume_from_checkpoint=None, **kwargs):
        resumed_from.append(resume_from_checkpoint)
        return train(self, resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    monkeypatch.setattr(ReflectSFTTrainer, "train", recording_train)
    with caplog.at_level(logging.WARNING, logger="reflect_trl.trainers.checkpoints"):
        assert main(_sft_argv(toy, out, "--max_steps", "6", "--resume_from_checkpoint", "true")) == 0
    assert resumed_from == [str(out / "checkpoint-2")]
    skipped = [r.getMessage() for r in caplog.records if r.name == "reflect_trl.trainers.checkpoints"]
    assert len(skipped) == 1 and f"partial checkpoint {out / 'checkpoint-4'}" in skipped[0]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 6


def test_rl_resumes_after_a_sigkill_while_saving(tiny_model_dir, tmp_path):
    """A real ``kill -9`` while checkpoint-4 is being written (weights and optimizer on disk, trainer_state.json not
    yet); ``--resume_from_checkpoint true`` then resumes from checkpoint-2 and the run finishes."""
    out = tmp_path / "rl"
    sentinel = tmp_path / "saving"
    argv = [
        "rl", "--model_name_or_path", tiny_model_dir, "--output_dir", str(out), "--use_cpu", "--bf16", "false",
        "--report_to", "none", "--max_steps", "4", "--per_device_train_batch_size", "8", "--num_generations", "4",
        "--num_train_tasks", "4", "--save_strategy", "steps", "--save_steps", "2", "--logging_steps", "1",
        "--log_episodes_every", "100",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}
    stalled = {**env, "REFLECT_TEST_STALL_SENTINEL": str(sentinel), "REFLECT_TEST_STALL_STEP": "4"}
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER), *argv],
        cwd=ROOT,
        env=stalled,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not sentinel.exists():
            assert proc.poll() is None, f"it ended before checkpoint-4: {proc.stderr.read()[-3000:]}"
            assert time.monotonic() < deadline, "checkpoint-4 was never saved"
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    partial = out / "checkpoint-4"
    assert (partial / "model.safetensors").is_file() and not (partial / "trainer_state.json").exists()

    done = subprocess.run(
        [sys.executable, str(DRIVER), *argv, "--resume_from_checkpoint", "true"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((out / "resumed_from.json").read_text()) == str(out / "checkpoint-2")
    skipped = [line for line in done.stderr.splitlines() if "skipping the partial checkpoint" in line]
    assert len(skipped) == 1 and str(partial) in skipped[0] and str(out / "checkpoint-2") in skipped[0]
    history = json.loads((out / "log_history.json").read_text())
    assert [h["step"] for h in history if "loss" in h] == [1, 2, 3, 4]  # 1-2 from checkpoint-2, 3-4 resumed
    assert missing_parts(partial, RL_FILES) == []  # rewritten whole by the resumed run
