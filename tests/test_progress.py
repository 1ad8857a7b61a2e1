"""Progress bars of long work: drawn on a terminal, quiet under --no-progress or when stderr is not a terminal."""

from __future__ import annotations

import io

from reflect_trl.evaluation import EvalConfiguration, EvalSettings, evaluate
from reflect_trl.progress import NO_PROGRESS_ENV, progress_bar, progress_enabled


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def as_terminal(monkeypatch) -> Terminal:
    """stderr as a terminal (what a person running reflect-trl sees). Called in the test itself: pytest's output
    capture replaces sys.stderr again after the fixtures ran."""
    stream = Terminal()
    monkeypatch.setattr("sys.stderr", stream)
    monkeypatch.setenv(NO_PROGRESS_ENV, "0")
    return stream


def test_progress_needs_a_terminal_and_can_be_turned_off(monkeypatch):
    as_terminal(monkeypatch)
    assert progress_enabled() and not progress_enabled(requested=False)
    monkeypatch.setenv(NO_PROGRESS_ENV, "1")
    assert not progress_enabled()
    monkeypatch.setenv(NO_PROGRESS_ENV, "0")
    monkeypatch.setattr("sys.stderr", io.StringIO())  # a pipe or a file
    assert not progress_enabled()
    assert progress_bar(total=3).disable


SETTINGS = dict(env_name="taxi", episodes_per_stage=2, stages=["pickup", "dropoff"], decodings=["greedy"])


def test_evaluation_shows_a_bar_per_configuration_and_stage(monkeypatch, capsys):
    terminal = as_terminal(monkeypatch)
    confs = [EvalConfiguration("oracle", "oracle"), EvalConfiguration("random", "random")]
    evaluate(confs, EvalSettings(**SETTINGS))
    bar = terminal.getvalue()
    assert "eval: 100%" in bar and "4/4" in bar and "random / dropoff / sampled" in bar
    printed = capsys.readouterr().out
    assert printed.count("[eval] ") == 4  # one result line per cell, outside the bar


def test_no_progress_quiets_the_bar_not_the_results(monkeypatch, capsys):
    terminal = as_terminal(monkeypatch)
    monkeypatch.setenv(NO_PROGRESS_ENV, "1")
    evaluate([EvalConfiguration("oracle", "oracle")], EvalSettings(**SETTINGS))
    assert terminal.getvalue() == ""
    assert capsys.readouterr().out.count("[eval] ") == 2


def test_eval_cli_no_progress_flag(tmp_path, monkeypatch):
    from reflect_trl.cli.eval import eval_cli

    terminal = as_terminal(monkeypatch)  # the variable the flag sets is restored after the test
    eval_cli(["--policy", "oracle", "--episodes_per_stage", "1", "--stages", "pickup", "--no-progress"]
             + ["--output_dir", str(tmp_path)])  # fmt: skip
    assert terminal.getvalue() == ""
