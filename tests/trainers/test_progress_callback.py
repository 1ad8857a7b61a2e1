"""The trainers' progress output: no bars off a terminal, every log a JSON line whose numbers are numbers."""

from __future__ import annotations

import io
import json

import pytest

from _toy_env import LineWorldEnv, LineWorldReflector, toy_prompts
from reflect_trl.data.builder import DataBuilderConfig, build_datasets
from reflect_trl.progress import DEPENDENCY_BAR_SWITCHES, NO_PROGRESS_ENV
from reflect_trl.trainers.progress_callback import ReflectProgressCallback, format_logs
from reflect_trl.trainers.sft_config import ReflectSFTConfig
from reflect_trl.trainers.sft_trainer import ReflectSFTTrainer


def test_format_logs_keeps_numbers_as_numbers():
    line = format_logs({"loss": 0.693147, "step": 3, "total_flos": 1e9, "nan": float("nan"), "ok": True})
    assert json.loads(line) == {"loss": 0.6931, "step": 3, "nan": "nan", "ok": True}
    assert '"loss": 0.6931' in line and "'" not in line


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def tiny_sft(tmp_path_factory):
    from reflect_trl.models import load_tokenizer
    from reflect_trl.tiny_models import build_tiny_model

    root = tmp_path_factory.mktemp("progress")
    config = DataBuilderConfig(
        env_name="line_world", n_train_tasks=4, n_val_tasks=1, output_dir=str(root / "data"), progress=False
    )
    data = build_datasets(config, env=LineWorldEnv(), reflector=LineWorldReflector())
    model = str(build_tiny_model(root / "model", arch="gpt2", preset="nano", texts=toy_prompts()))
    data_dir = str(root / "data" / "line_world" / "policy_plain")
    return data["policy_plain"]["train"], model, load_tokenizer(model, padding_side="right"), data_dir


def train_briefly(tiny_sft, tmp_path):
    train, model, tokenizer, _ = tiny_sft
    args = ReflectSFTConfig(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, logging_steps=1,
        save_strategy="no", report_to="none", use_cpu=True, bf16=False, dataset_num_proc=None,
    )  # fmt: skip
    trainer = ReflectSFTTrainer(model=model, args=args, train_dataset=train, processing_class=tokenizer)
    names = [type(cb).__name__ for cb in trainer.callback_handler.callbacks]
    assert "ReflectProgressCallback" in names
    assert "ProgressCallback" not in names and "PrinterCallback" not in names
    trainer.train()


@pytest.fixture
def dependency_bars_restored():
    """The dependencies' bars switched on again after the test (the CLI switches them off in-process)."""
    yield
    from datasets.utils import logging as datasets_logging
    from huggingface_hub.utils import enable_progress_bars
    from transformers.utils import logging as transformers_logging

    enable_progress_bars()
    transformers_logging.enable_progress_bar()
    datasets_logging.enable_progress_bar()


@pytest.mark.usefixtures("dependency_bars_restored")
def test_sft_cli_logs_json_numbers_and_draws_no_bar_off_a_terminal(tiny_sft, tmp_path, monkeypatch, capsys):
    from reflect_trl.cli import main

    _, model, _, data = tiny_sft
    stderr = io.StringIO()  # a redirected log
    monkeypatch.setattr("sys.stderr", stderr)
    monkeypatch.setenv(NO_PROGRESS_ENV, "0")
    for variable in DEPENDENCY_BAR_SWITCHES:
        monkeypatch.setenv(variable, "0")  # restored after the test
    argv = ["sft", "--model_name_or_path", model, "--dataset_path", data, "--role", "policy"]
    argv += ["--output_dir", str(tmp_path), "--max_steps", "2", "--per_device_train_batch_size", "4"]
    argv += ["--logging_steps", "1", "--report_to", "none", "--use_cpu", "true", "--max_eval_samples", "4"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    logs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(logs) >= 3, out  # two steps, the final summary (and the evaluation)
    assert isinstance(logs[0]["loss"], float) and isinstance(logs[0]["learning_rate"], float)
    final = next(log for log in logs if "train_runtime" in log)
    assert isinstance(final["train_runtime"], float) and isinstance(final["train_loss"], float)
    assert "it/s" not in stderr.getvalue() and "%|" not in stderr.getvalue(), stderr.getvalue()


def test_the_bar_is_drawn_on_a_terminal_unless_turned_off(tiny_sft, tmp_path, monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    monkeypatch.setenv(NO_PROGRESS_ENV, "0")
    train_briefly(tiny_sft, tmp_path / "a")
    assert "2/2" in terminal.getvalue()
    terminal.seek(0), terminal.truncate()
    monkeypatch.setenv(NO_PROGRESS_ENV, "1")  # --no-progress
    train_briefly(tiny_sft, tmp_path / "b")
    assert "2/2" not in terminal.getvalue()  # (the command line turns the dependencies' bars off too)


def test_callback_prints_through_the_bar_when_there_is_one(monkeypatch, capsys):
    callback = ReflectProgressCallback()
    state = type("State", (), {"is_world_process_zero": True})()
    callback.on_log(None, state, None, logs={"loss": 1.0})
    assert capsys.readouterr().out == '{"loss": 1.0}\n'
