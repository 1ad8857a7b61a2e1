"""Learning curves mark the curriculum stages and plot success per stage; ``reflect-trl plot`` checks every input
before it writes a file."""

from __future__ import annotations

import json

import pytest

from reflect_trl.cli.plot import plot_cli
from reflect_trl.errors import MissingPathError, UsageError
from reflect_trl.pipelines import plotting
from reflect_trl.pipelines.plotting import plot_learning_curves, stage_spans

STAGES = ("pickup", "dropoff", "full")


def history(starts=(0, 10, 20), steps: int = 30, levels=(0.9, 0.5, 0.2), names=STAGES) -> list[dict]:
    """A log history with ``curriculum/stage`` on every step and the success of the current stage."""
    out = []
    for step in range(1, steps + 1):
        index = max(i for i, s in enumerate(starts) if step > s)
        rate = levels[index]
        out.append(
            {
                "step": step,
                "env/success_rate": rate,
                f"stage/{names[index]}/success_rate": rate,
                "curriculum/stage": float(index),
                "loss": 0.1,
            }
        )
    return out


def test_stage_spans_follow_the_logged_stage():
    spans = stage_spans(history())
    assert [(s.index, s.name, s.first_step, s.last_step) for s in spans] == [
        (0, "pickup", 1, 10),
        (1, "dropoff", 11, 20),
        (2, "full", 21, 30),
    ]
    # a log that averages two stages counts for the nearer one and names none
    mixed = history()
    mixed[10] = {**mixed[10], "curriculum/stage": 0.8, "stage/pickup/success_rate": 0.9}
    assert [s.index for s in stage_spans(mixed)] == [0, 1, 2]
    assert stage_spans([{"step": 1, "loss": 1.0}]) == []


@pytest.fixture
def drawn(monkeypatch):
    """The (figure, axes) a plot function saved."""
    seen = {}

    def save(fig, ax, path, **_):
        seen["fig"], seen["ax"] = fig, ax
        return path

    monkeypatch.setattr(plotting, "_save", save)
    return seen


def test_learning_curves_shade_and_name_the_stages(tmp_path, drawn):
    runs = {"Reflect-RL": history(), "no curriculum": history(starts=(0,), levels=(0.3,), names=("full",))}
    plot_learning_curves(runs, tmp_path / "curves.png", window=3)
    ax = drawn["ax"]
    assert [t.get_text() for t in ax.texts] == list(STAGES)
    assert len(ax.patches) == 2  # every other stage shaded
    # one segment per stage for the curriculum run (the moving average restarts), one for the other run
    segments = [line for line in ax.get_lines() if len(line.get_xdata()) > 2]
    assert len(segments) == 3 + 1
    first = segments[0]
    assert list(first.get_xdata()) == list(range(1, 11)) and set(first.get_ydata()) == {0.9}
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["Reflect-RL", "no curriculum (full only)"]
    assert "curriculum stages" in ax.get_title()


def test_learning_curves_without_stages(tmp_path, drawn):
    plain = [{"step": s, "env/success_rate": 0.5} for s in range(1, 6)]
    plot_learning_curves({"run": plain}, tmp_path / "curves.png")
    assert len(drawn["ax"].texts) == 0 and len(drawn["ax"].get_lines()) == 1


def write_run(directory, log: list[dict]):
    directory.mkdir(parents=True)
    (directory / "log_history.json").write_text(json.dumps(log))
    return directory


def test_plot_cli_writes_curves_and_bars(tmp_path):
    reflect = write_run(tmp_path / "rl", history())
    plain = write_run(tmp_path / "rl_plain", history(levels=(0.5, 0.1, 0.0)))
    results = [
        {
            "configuration": c,
            "stage": s,
            "decoding": "greedy",
            "success_rate": 0.5,
            "ci_low": 0.3,
            "ci_high": 0.7,
        }
        for c in ("SFT only", "Reflect-RL")
        for s in STAGES
    ]
    (tmp_path / "results.json").write_text(json.dumps({"results": results}))
    out = tmp_path / "plots"
    written = plot_cli(
        [
            "--runs",
            f"reflect={reflect},plain={plain}",
            "--eval",
            str(tmp_path / "results.json"),
            "--output_dir",
            str(out),
        ]
    )
    assert [p.name for p in written] == ["learning_curves.png", "success_bars.png"]
    assert all(p.stat().st_size > 0 for p in written)


def test_plot_cli_checks_everything_before_writing(tmp_path):
    run = write_run(tmp_path / "rl", history())
    out = tmp_path / "plots"
    with pytest.raises(MissingPathError, match="--eval .*missing.json"):
        plot_cli(["--runs", f"a={run}", "--eval", str(tmp_path / "missing.json"), "--output_dir", str(out)])
    with pytest.raises(UsageError, match="--key 'env/sucess_rate' was not logged"):
        plot_cli(["--runs", f"a={run}", "--key", "env/sucess_rate", "--output_dir", str(out)])
    with pytest.raises(UsageError, match="not name=run_dir"):
        plot_cli(["--runs", str(run), "--output_dir", str(out)])
    (tmp_path / "results.json").write_text(json.dumps({"results": [{"decoding": "greedy"}]}))
    with pytest.raises(UsageError, match="--decoding 'sampled'"):
        plot_cli(["--runs", f"a={run}", "--eval", str(tmp_path / "results.json"), "--decoding", "sampled"])
    assert not out.exists()


def with_evaluations(log: list[dict], every: int = 10) -> list[dict]:
    """``log`` plus evaluations during training at step 0 and every ``every`` steps (as Trainer logs them)."""
    evals = [
        {
            "step": s,
            "eval_success_rate": s / 100,
            **{f"eval_{n}_success_rate": s / 100 + i for i, n in enumerate(STAGES)},
        }
        for s in range(0, log[-1]["step"] + 1, every)
    ]
    return sorted(log + evals, key=lambda h: h["step"])


def test_eval_curves_one_panel_per_evaluated_stage(tmp_path, drawn):
    runs = {"Reflect-RL": with_evaluations(history()), "without evaluations": history()}
    assert plotting.eval_stages(runs["Reflect-RL"]) == list(STAGES)
    plotting.plot_eval_curves(runs, tmp_path / "eval.png")
    axes = drawn["fig"].axes
    assert [ax.get_title() for ax in axes] == [f"evaluated on {s}" for s in STAGES]
    for i, ax in enumerate(axes):
        # one curve: the run without evaluations draws nothing (the other lines are the stage boundaries)
        (line,) = [x for x in ax.get_lines() if x.get_marker() == "."]
        assert list(line.get_xdata()) == [0, 10, 20, 30]
        assert list(line.get_ydata()) == pytest.approx([s / 100 + i for s in (0, 10, 20, 30)])
        assert [t.get_text() for t in ax.texts] == list(STAGES)  # the trained stage, shaded and named
    with pytest.raises(ValueError, match="no run logged evaluations"):
        plotting.plot_eval_curves({"run": history()}, tmp_path / "none.png")


def test_plot_cli_adds_eval_curves_when_runs_evaluated(tmp_path):
    run = write_run(tmp_path / "rl", with_evaluations(history()))
    written = plot_cli(["--runs", f"reflect={run}", "--output_dir", str(tmp_path / "plots")])
    assert [p.name for p in written] == ["learning_curves.png", "eval_curves.png"]
    assert all(p.stat().st_size > 0 for p in written)


def eval_row(configuration: str, stage: str, rate: float, decoding: str = "greedy") -> dict:
    return {
        "configuration": configuration, "stage": stage, "decoding": decoding, "success_rate": rate,
        "ci_low": max(0.0, rate - 0.1), "ci_high": min(1.0, rate + 0.1),
    }  # fmt: skip


def test_success_bars_show_every_configuration_and_zero_bars(tmp_path):
    from reflect_trl.pipelines.plotting import plot_success_bars, success_bars, success_bars_figure

    results = [
        eval_row("oracle", "pickup", 1.0),
        eval_row("oracle", "full", 1.0),
        eval_row("random", "pickup", 0.0, "sampled"),  # the random policy only samples
        eval_row("random", "full", 0.05, "sampled"),
        eval_row("Reflect-RL", "pickup", 0.0),
        eval_row("Reflect-RL", "pickup", 0.5, "sampled"),
        eval_row("SFT", "full", 0.25),  # not evaluated on pickup
    ]
    bars = success_bars(results, "greedy")
    assert [(b.label, b.stage, b.rate) for b in bars] == [
        ("oracle", "pickup", 1.0), ("oracle", "full", 1.0),
        ("random (sampled)", "pickup", 0.0), ("random (sampled)", "full", 0.05),
        ("Reflect-RL", "pickup", 0.0), ("Reflect-RL", "full", None),
        ("SFT", "pickup", None), ("SFT", "full", 0.25),
    ]  # fmt: skip
    fig, ax = success_bars_figure(results, "greedy")
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("0%") == 2 and texts.count("n/a") == 2 and "100%" in texts and "25%" in texts
    zero_marks = [line for line in ax.lines if list(line.get_ydata()) == [0.004, 0.004]]
    assert len(zero_marks) == 2  # a 0 % bar is marked on the axis
    labels = [c.get_label() for c in ax.containers if hasattr(c, "patches")]
    assert labels == ["oracle", "random (sampled)", "Reflect-RL", "SFT"]
    import matplotlib.pyplot as plt

    plt.close(fig)
    assert plot_success_bars(results, tmp_path / "bars.png").stat().st_size > 0
    with pytest.raises(ValueError, match="no results with decoding 'beam'"):
        success_bars(results, "beam")
