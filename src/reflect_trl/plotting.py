"""Plots: RL learning curves (success rate per variant) and a bar chart of final success with 95 % CIs."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

LOG_HISTORY_FILE = "log_history.json"


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


def _save(fig, ax, path: str | Path) -> Path:
    """Legend, layout, write the PNG (creating its folder) and free the figure."""
    import matplotlib.pyplot as plt

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


def plot_learning_curves(
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    path: str | Path,
    key: str = "env/success_rate",
    window: int = 5,
    title: str = "RL training: success rate of rollout episodes",
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, history in runs.items():
        points = [(h["step"], h[key]) for h in history if key in h and "step" in h]
        if not points:
            continue
        steps, values = zip(*points, strict=True)
        ax.plot(steps, _smooth(values, window), label=name)
        stage_changes = [
            h["step"]
            for a, h in zip(history, history[1:], strict=False)
            if "curriculum/stage" in h
            and "curriculum/stage" in a
            and h["curriculum/stage"] != a["curriculum/stage"]
        ]
        for s in stage_changes:
            ax.axvline(s, color="grey", alpha=0.15, lw=1)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"{key} (moving average, {window} logs)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return _save(fig, ax, path)


def plot_success_bars(
    results: Sequence[Mapping[str, Any]],
    path: str | Path,
    decoding: str = "greedy",
    title: str = "Held-out success rate (95 % Wilson CI)",
) -> Path:
    """Grouped bars: one group per stage, one bar per configuration, error bars = the Wilson interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results if r["decoding"] == decoding]
    if not rows:
        raise ValueError(f"no results with decoding {decoding!r}")
    stages = list(dict.fromkeys(r["stage"] for r in rows))
    configs = list(dict.fromkeys(r["configuration"] for r in rows))
    width = 0.8 / len(configs)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(stages) * len(configs) / 2), 4))
    for i, conf in enumerate(configs):
        xs, ys, lo, hi = [], [], [], []
        for j, stage in enumerate(stages):
            match = [r for r in rows if r["configuration"] == conf and r["stage"] == stage]
            if not match:
                continue
            r = match[0]
            xs.append(j + (i - (len(configs) - 1) / 2) * width)
            ys.append(r["success_rate"])
            lo.append(max(0.0, r["success_rate"] - r["ci_low"]))  # clamp float round-off at p = 0 or 1
            hi.append(max(0.0, r["ci_high"] - r["success_rate"]))
        ax.bar(xs, ys, width=width, yerr=[lo, hi], capsize=3, label=conf)
    ax.set_xticks(range(len(stages)), stages)
    ax.set_ylabel(f"success rate ({decoding})")
    ax.set_ylim(0, 1.05)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, ax, path)


def plot_cli(argv: Sequence[str] | None = None) -> list[Path]:
    """``reflect-trl plot --runs name=outputs/x/rl,... --eval outputs/eval/results.json --output_dir outputs/plots``"""
    parser = argparse.ArgumentParser(prog="reflect-trl plot", description=__doc__)
    parser.add_argument(
        "--runs", default="", help="comma-separated name=run_dir pairs (RL output directories)"
    )
    parser.add_argument("--eval", default=None, help="results.json written by `reflect-trl eval`")
    parser.add_argument("--decoding", default="greedy")
    parser.add_argument("--key", default="env/success_rate")
    parser.add_argument("--output_dir", default="outputs/plots")
    args = parser.parse_args(argv)
    if not args.runs and not args.eval:
        parser.error("give --runs and/or --eval")
    written = []
    if args.runs:
        runs = {}
        for item in args.runs.split(","):
            name, sep, run_dir = item.partition("=")
            if not sep:
                parser.error(f"--runs item {item!r} is not name=dir")
            runs[name] = load_log_history(run_dir)
        written.append(
            plot_learning_curves(runs, Path(args.output_dir) / "learning_curves.png", key=args.key)
        )
    if args.eval:
        results = json.loads(Path(args.eval).read_text())["results"]
        written.append(
            plot_success_bars(results, Path(args.output_dir) / "success_bars.png", decoding=args.decoding)
        )
    for p in written:
        print(f"[plot] wrote {p}")
    return written
