"""Plots: RL learning curves (success rate per variant, curriculum stages marked) and bar charts of held-out
success with 95 % CIs.

A run trained with a curriculum logs ``curriculum/stage`` (the stage index) and ``stage/<name>/success_rate`` on every
step. The learning curves shade each stage and name it, and restart the moving average where a stage starts, plotting
the success of that stage only: a drop where a harder stage begins reads as what it is, not as a regression.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOG_HISTORY_FILE = "log_history.json"
STAGE_KEY = "curriculum/stage"


@dataclass
class StageSpan:
    """One curriculum stage of a run: its index, name (None if the logs do not say) and logged step range."""

    index: int
    name: str | None
    first_step: float
    last_step: float


def _stage_name(entry: Mapping[str, Any]) -> str | None:
    names = [
        k[len("stage/") : -len("/success_rate")]
        for k in entry
        if k.startswith("stage/") and k.endswith("/success_rate")
    ]
    return names[0] if len(names) == 1 else None


def stage_spans(history: Sequence[Mapping[str, Any]]) -> list[StageSpan]:
    """The curriculum stages a run went through, in order (from ``curriculum/stage``; a log that averages two
    stages counts for the nearer one). Empty when the run logged no stage."""
    spans: list[StageSpan] = []
    for entry in history:
        if STAGE_KEY not in entry or "step" not in entry:
            continue
        value = float(entry[STAGE_KEY])
        index, step = int(round(value)), entry["step"]
        name = _stage_name(entry) if value == index else None
        if spans and spans[-1].index == index:
            spans[-1].last_step = step
            spans[-1].name = spans[-1].name or name
        else:
            spans.append(StageSpan(index, name, step, step))
    return spans


def _segments(
    history: Sequence[Mapping[str, Any]], key: str, spans: Sequence[StageSpan]
) -> list[tuple[list[float], list[float]]]:
    """The (steps, values) of ``key``, cut where a stage starts; for the success rate, each stage's own
    ``stage/<name>/success_rate`` where the logs have it."""
    points = [(h["step"], h) for h in history if "step" in h]
    if len(spans) < 2:
        kept = [(step, h[key]) for step, h in points if key in h]
        return [([p[0] for p in kept], [p[1] for p in kept])] if kept else []
    out = []
    bounds = [span.first_step for span in spans[1:]] + [float("inf")]
    start = float("-inf")
    for span, end in zip(spans, bounds, strict=True):
        stage_key = f"stage/{span.name}/success_rate" if span.name and key == "env/success_rate" else key
        kept = [
            (step, h[stage_key] if stage_key in h else h[key])
            for step, h in points
            if start <= step < end and (stage_key in h or key in h)
        ]
        if kept:
            out.append(([p[0] for p in kept], [p[1] for p in kept]))
        start = end
    return out


def load_log_history(run_dir: str | Path) -> list[dict[str, Any]]:
    """A run's logged metrics: ``log_history.json`` (written by ``reflect-trl rl``) or a checkpoint's
    ``trainer_state.json``."""
    run_dir = Path(run_dir)
    direct = run_dir / LOG_HISTORY_FILE
    if direct.is_file():
        return json.loads(direct.read_text())
    states = sorted(
        run_dir.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[-1])
    )
    if not states:
        raise FileNotFoundError(f"{run_dir}: no {LOG_HISTORY_FILE} and no checkpoint-*/trainer_state.json")
    return json.loads(states[-1].read_text())["log_history"]


def _save(fig, ax, path: str | Path, figure_legend: bool = False) -> Path:
    """Legend (in ``ax``, or with ``figure_legend`` one for the figure, under its title), layout, write the PNG
    (creating its folder) and free the figure."""
    import matplotlib.pyplot as plt

    if figure_legend:  # the labelled lines of every panel, each label once
        entries = dict(
            (label, handle)
            for a in fig.axes
            for handle, label in zip(*a.get_legend_handles_labels(), strict=True)
        )
        fig.legend(
            list(entries.values()),
            list(entries),
            loc="upper center",
            bbox_to_anchor=(0.5, 0.89),
            ncol=4,
            fontsize=8,
        )
        fig.tight_layout(rect=(0, 0, 1, 0.93))
    else:
        ax.legend(fontsize=8)
        fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _smooth(values: Sequence[float], window: int) -> list[float]:
    out, acc = [], []
    for v in values:
        acc.append(v)
        if len(acc) > window:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def _mark_stages(ax, spans: Sequence[StageSpan], last_step: float) -> None:
    """Shade every other stage and write each stage's name at the top of its span."""
    edges = [spans[0].first_step] + [
        (a.last_step + b.first_step) / 2 for a, b in zip(spans, spans[1:], strict=False)
    ]
    edges.append(max(last_step, spans[-1].last_step))
    for i, span in enumerate(spans):
        left, right = edges[i], edges[i + 1]
        if i % 2 == 0:
            ax.axvspan(left, right, color="grey", alpha=0.08, lw=0)
        if i:
            ax.axvline(left, color="grey", alpha=0.6, lw=1, ls="--")
        label = span.name or f"stage {span.index}"
        ax.text(
            (left + right) / 2,
            0.98,
            label,
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="top",
            fontsize=8,
            color="dimgrey",
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.7, "pad": 1},
        )


def plot_learning_curves(
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    path: str | Path,
    key: str = "env/success_rate",
    window: int = 5,
    title: str = "RL training: success rate of rollout episodes",
    mark_stages: bool = True,
) -> Path:
    """One curve per run (moving average over ``window`` logs). With ``mark_stages`` the curriculum stages of the
    first run that has several are shaded and named, and every curve restarts at a stage change (per-stage success)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    all_spans = {name: stage_spans(history) if mark_stages else [] for name, history in runs.items()}
    reference = next((spans for spans in all_spans.values() if len(spans) > 1), [])
    last_step = 0.0
    for i, (name, history) in enumerate(runs.items()):
        spans = all_spans[name]
        segments = _segments(history, key, spans)
        color = f"C{i % 10}"
        label = name
        if reference and len(spans) == 1 and spans[0].name and spans[0].name != "all":
            label = f"{name} ({spans[0].name} only)"  # e.g. the run without a curriculum
        for j, (steps, values) in enumerate(segments):
            ax.plot(steps, _smooth(values, window), color=color, label=label if j == 0 else None)
            last_step = max(last_step, steps[-1])
        starts = [s.first_step for s in spans]
        if len(spans) > 1 and spans is not reference and starts != [s.first_step for s in reference]:
            for span in spans[1:]:  # this run's own stage changes, where they differ from the shaded ones
                ax.axvline(span.first_step, color=color, alpha=0.5, lw=1, ls=":")
    if reference:
        _mark_stages(ax, reference, last_step)
        title += "\n(shaded: curriculum stages, easy to hard; each curve restarts per stage)"
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"{key} (moving average, {window} logs)")
    if "rate" in key:
        ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    return _save(fig, ax, path)


@dataclass(frozen=True)
class SuccessBar:
    """One bar of :func:`plot_success_bars`: a configuration's success in a stage (None: not evaluated there)."""

    label: str  # the configuration, with its decoding when that is not the plotted one
    stage: str
    rate: float | None
    ci_low: float | None = None
    ci_high: float | None = None


def success_bars(results: Sequence[Mapping[str, Any]], decoding: str = "greedy") -> list[SuccessBar]:
    """Every configuration x stage of ``results`` as a bar, in order of appearance. A configuration evaluated without
    ``decoding`` (the random policy always samples) keeps its own decoding, named in its label; a stage it was not
    evaluated in gets a bar with ``rate`` None."""
    if not any(r["decoding"] == decoding for r in results):
        raise ValueError(f"no results with decoding {decoding!r}")
    stages = list(dict.fromkeys(r["stage"] for r in results))
    configs = list(dict.fromkeys(r["configuration"] for r in results))
    bars = []
    for conf in configs:
        own = [r for r in results if r["configuration"] == conf]
        decodings = list(dict.fromkeys(r["decoding"] for r in own))
        chosen = decoding if decoding in decodings else decodings[0]
        label = conf if chosen == decoding else f"{conf} ({chosen})"
        for stage in stages:
            r = next((x for x in own if x["stage"] == stage and x["decoding"] == chosen), None)
            if r is None:
                bars.append(SuccessBar(label, stage, None))
            else:
                bars.append(
                    SuccessBar(label, stage, float(r["success_rate"]), r.get("ci_low"), r.get("ci_high"))
                )
    return bars


def plot_success_bars(
    results: Sequence[Mapping[str, Any]],
    path: str | Path,
    decoding: str = "greedy",
    title: str = "Held-out success rate (95 % Wilson CI)",
) -> Path:
    """Grouped bars: one group per stage, one bar per configuration (:func:`success_bars`: every configuration, the
    random policy with its sampled decoding), error bars = the Wilson interval. Every bar is labelled with its rate,
    so a 0 % bar shows as a mark on the axis with "0%" above it; a stage a configuration was not evaluated in says
    "n/a"."""
    fig, ax = success_bars_figure(results, decoding, title)
    return _save(fig, ax, path)


def success_bars_figure(results: Sequence[Mapping[str, Any]], decoding: str = "greedy", title: str = ""):
    """The figure of :func:`plot_success_bars` (not saved)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = success_bars(results, decoding)
    stages = list(dict.fromkeys(b.stage for b in bars))
    configs = list(dict.fromkeys(b.label for b in bars))
    width = 0.8 / len(configs)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(stages) * len(configs) / 2), 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, conf in enumerate(configs):
        color = colors[i % len(colors)]
        xs, ys, lo, hi = [], [], [], []
        for j, stage in enumerate(stages):
            bar = next(b for b in bars if b.label == conf and b.stage == stage)
            x = j + (i - (len(configs) - 1) / 2) * width
            if bar.rate is None:
                ax.text(x, 0.01, "n/a", ha="center", va="bottom", fontsize=7, color=color, rotation=90)
                continue
            xs.append(x)
            ys.append(bar.rate)
            low = bar.rate if bar.ci_low is None else bar.ci_low
            high = bar.rate if bar.ci_high is None else bar.ci_high
            lo.append(max(0.0, bar.rate - low))  # clamp float round-off at p = 0 or 1
            hi.append(max(0.0, high - bar.rate))
            top = max(bar.rate, high)
            ax.text(
                x, top + 0.015, f"{100 * bar.rate:.0f}%", ha="center", va="bottom", fontsize=7, color=color
            )
            if bar.rate == 0.0:  # a bar of height 0 is invisible: mark it on the axis
                ax.plot(
                    [x - width * 0.4, x + width * 0.4],
                    [0.004, 0.004],
                    color=color,
                    linewidth=3,
                    solid_capstyle="butt",
                )
        ax.bar(xs, ys, width=width, yerr=[lo, hi], capsize=3, label=conf, color=color)
    ax.set_xticks(range(len(stages)), stages)
    ax.set_ylabel(f"success rate ({decoding})")
    ax.set_ylim(0, 1.12)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    return fig, ax


def plot_seed_bars(
    rows: Sequence[Mapping[str, Any]],
    seeds: Sequence[int],
    path: str | Path,
    decoding: str = "greedy",
    title: str = "Held-out success, pooled over seeds (95 % Wilson CI over instances); dots: each seed",
) -> Path:
    """Grouped bars of pooled success (``reflect-trl reproduce`` rows) with every seed's rate drawn as a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = [r for r in rows if r["decoding"] == decoding]
    if not chosen:
        raise ValueError(f"no rows with decoding {decoding!r}")
    stages = list(dict.fromkeys(r["stage"] for r in chosen))
    configs = list(dict.fromkeys(r["configuration"] for r in chosen))
    width = 0.8 / len(configs)
    fig, ax = plt.subplots(figsize=(max(7, 1.4 * len(stages) * len(configs) / 2), 4.5))
    markers = "os^Dv<>ph"
    for i, conf in enumerate(configs):
        xs, ys, lo, hi = [], [], [], []
        for j, stage in enumerate(stages):
            r = next((x for x in chosen if x["configuration"] == conf and x["stage"] == stage), None)
            if r is None:
                continue
            x = j + (i - (len(configs) - 1) / 2) * width
            xs.append(x)
            ys.append(r["success_rate"])
            lo.append(max(0.0, r["success_rate"] - r["ci_low"]))
            hi.append(max(0.0, r["ci_high"] - r["success_rate"]))
            for k, rate in enumerate(r["per_seed"]):
                if rate is None:  # a seed with no episode in the row
                    continue
                ax.plot(x, rate, markers[k % len(markers)], color="black", ms=3, alpha=0.7)
        ax.bar(xs, ys, width=width, yerr=[lo, hi], capsize=3, label=conf, alpha=0.85)
    ax.set_xticks(range(len(stages)), stages)
    ax.set_ylabel(f"success rate ({decoding})")
    ax.set_ylim(0, 1.05)
    ax.set_title(title + f"; seeds {', '.join(map(str, seeds))}", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, ax, path)


def eval_stages(history: Sequence[Mapping[str, Any]]) -> list[str]:
    """The stages of a run's evaluations during training (``eval_<stage>_success_rate``), in logged order."""
    keys = (k for h in history for k in h if k.startswith("eval_") and k.endswith("_success_rate"))
    return [k[len("eval_") : -len("_success_rate")] for k in dict.fromkeys(keys) if k != "eval_success_rate"]


def plot_eval_curves(
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    path: str | Path,
    title: str = "Evaluation during training: greedy success on held-out tasks",
) -> Path:
    """One panel per stage: the greedy held-out success rate of each run's evaluations during training
    (``eval_<stage>_success_rate`` of ``ReflectPPOTrainer.evaluate``), curriculum stages shaded and named."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = list(dict.fromkeys(s for history in runs.values() for s in eval_stages(history)))
    if not stages:
        raise ValueError("no run logged evaluations during training (eval_<stage>_success_rate)")
    fig, axes = plt.subplots(1, len(stages), figsize=(3.4 * len(stages), 4.2), sharey=True, squeeze=False)
    reference = next((sp for sp in (stage_spans(h) for h in runs.values()) if len(sp) > 1), [])
    last_step = max(h["step"] for history in runs.values() for h in history if "step" in h)
    for ax, stage in zip(axes[0], stages, strict=True):
        key = f"eval_{stage}_success_rate"
        for i, (name, history) in enumerate(runs.items()):
            points = [(h["step"], h[key]) for h in history if key in h]
            if points:
                ax.plot(*zip(*points, strict=True), marker=".", color=f"C{i % 10}", label=name)
        if reference:
            _mark_stages(ax, reference, last_step)
        ax.set_title(f"evaluated on {stage}", fontsize=9)
        ax.set_xlabel("optimizer step")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("greedy success rate")
    fig.suptitle(title + ("\n(shaded: the curriculum stage being trained)" if reference else ""), fontsize=10)
    return _save(fig, axes[0][0], path, figure_legend=True)


def plot_eval_curves_if_logged(
    runs: Mapping[str, Sequence[Mapping[str, Any]]], path: str | Path
) -> list[Path]:
    """``[plot_eval_curves(runs, path)]`` when any run evaluated during training, else ``[]`` (nothing to draw)."""
    if not any(eval_stages(history) for history in runs.values()):
        return []
    return [plot_eval_curves(runs, path)]
