"""``--help`` of every subcommand: a description, the project's own options first (with help text), ``--config``,
and a pointer to ``--help-all`` for the inherited TRL/transformers options."""

from __future__ import annotations

import argparse
import os

import pytest

from reflect_trl.cli import COMMANDS, main


def help_of(argv: list[str], capsys) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(
    ("command", "own", "description", "title"),
    [
        ("rl", "--env_name", "Stage 2 of Reflect-RL", "environment:"),
        ("sft", "--dataset_path", "Stage 1 of Reflect-RL", "data:"),
        (
            "data",
            "--negative_prob",
            "Generate the reflection / policy SFT data sets",
            "options of reflect-trl data:",
        ),
    ],
)
def test_trl_commands_show_their_own_options_first(command, own, description, title, capsys):
    text = help_of([command, "--help"], capsys)
    lines = text.splitlines()
    assert lines[0].startswith(f"usage: reflect-trl {command} [--config RECIPE.yaml]")
    assert description in text and "--config RECIPE.yaml" in text
    assert title in lines
    position = next(i for i, line in enumerate(lines) if line.strip().startswith(own))
    assert position < 60, f"{own} at line {position}"
    assert "Failed to load" not in text
    if command != "data":
        assert f"`reflect-trl {command} --help-all`" in text
        assert "--adam_beta1" not in text  # an inherited option: only in --help-all
        full = help_of([command, "--help-all"], capsys)
        assert "--adam_beta1" in full and own in full and len(full.splitlines()) > 2 * len(lines)
        assert full.startswith(f"usage: reflect-trl {command}")


def test_rl_help_is_grouped_and_names_the_recipes_values(capsys):
    text = help_of(["rl", "--help"], capsys)
    titles = [line[:-1] for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert titles == [
        "usage",
        "model and run",
        "environment",
        "reflection",
        "RL",
        "curriculum",
        "logging, evaluation and checkpoints",
        "speed and memory",
    ]
    for group, option in [("environment", "--env_name"), ("reflection", "--reflection_temperature")]:
        assert text.index(f"{group}:") < text.index(f"  {option} ")
    for option in ("--model_name_or_path", "--output_dir", "--max_steps", "--learning_rate", "--report_to"):
        assert f"  {option} " in text, option
    flat = " ".join(text.split())
    # the defaults that differ from the shipped recipes say so
    assert "(default: 1.0; recipes: 0.0 (every GPU recipe, every CPU recipe))" in flat
    assert "0.001 (taxi/cpu)" in flat and "0.0005 (lock_puzzle)" in flat  # learning_rate
    # advantage_estimator: every shipped recipe uses the default, so no recipe value is named
    assert "reinforce | rloo | gae | gigpo (reflect_trl.rl_math) (default: gigpo)" in flat
    assert "--gradient_checkpointing" not in text  # a deprecated alias


@pytest.mark.parametrize("command", ["build-tiny", "eval", "plot", "relabel", "lookup-data", "demo", "envs"])
def test_every_option_has_help_text(command, monkeypatch, capsys):
    parsers: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.print_help

    def record(self, file=None):
        parsers.append(self)
        return original(self, file)

    monkeypatch.setattr(argparse.ArgumentParser, "print_help", record)
    text = help_of([command, "--help"], capsys)
    assert text.startswith(f"usage: reflect-trl {command}")
    [parser] = parsers
    assert parser.description
    missing = [a.option_strings for a in parser._actions if a.option_strings and not (a.help or "").strip()]
    assert not missing, missing


def test_top_level_usage_lists_commands_and_global_options(capsys):
    text = help_of(["--help"], capsys)
    for name in COMMANDS:
        assert f"  {name} " in text
    assert "--debug" in text and "--no-progress" in text


def test_no_progress_and_debug_are_global_options(monkeypatch, capsys):
    from reflect_trl.errors import DEBUG_ENV
    from reflect_trl.progress import NO_PROGRESS_ENV

    monkeypatch.setenv(DEBUG_ENV, "0")  # restored after the test
    monkeypatch.setenv(NO_PROGRESS_ENV, "0")
    assert main(["--debug", "--no-progress", "envs"]) == 0
    assert os.environ[DEBUG_ENV] == "1" and os.environ[NO_PROGRESS_ENV] == "1"
    assert "taxi" in capsys.readouterr().out


def test_no_help_imports_torch():
    """Every ``reflect-trl <command> --help`` answers without importing torch (~0.1 s each)."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom reflect_trl.cli import COMMANDS, main\n"
        "for command in COMMANDS:\n    assert main([command, '--help']) == 0, command\n"
        "print([m for m in ('torch',) if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"
