"""``reflect-trl plot``: learning curves, evaluation curves and success bars of finished runs."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reflect_trl.pipelines.plotting import (
    load_log_history,
    plot_eval_curves_if_logged,
    plot_learning_curves,
    plot_success_bars,
)


def _read_runs(spec: str) -> dict[str, list[dict[str, Any]]]:
    """``name=dir,name=dir`` (or a JSON object ``{"name": "dir"}``) -> each run's log history."""
    from reflect_trl.errors import MissingPathError, UsageError

    text = spec.strip()
    if text.startswith("{"):
        try:
            pairs = [(str(k), str(v)) for k, v in json.loads(text).items()]
        except (json.JSONDecodeError, AttributeError) as err:
            raise UsageError(f"--runs {spec!r} is not a JSON object of name: run_dir ({err})") from None
    else:
        pairs = []
        for item in (part.strip() for part in text.split(",") if part.strip()):
            name, sep, run_dir = item.partition("=")
            if not sep or not name or not run_dir:
                raise UsageError(
                    f"--runs item {item!r} is not name=run_dir (e.g. reflect=outputs/taxi/cpu/rl)"
                )
            pairs.append((name, run_dir))
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise UsageError(f"--runs names must be distinct, got {names}")
    runs = {}
    for name, run_dir in pairs:
        if not Path(run_dir).is_dir():
            raise MissingPathError(
                f"--runs {name}={run_dir}: the directory does not exist (an RL output_dir)"
            )
        try:
            runs[name] = load_log_history(run_dir)
        except FileNotFoundError as err:
            raise MissingPathError(
                f"--runs {name}={run_dir}: {err} (is it the output_dir of `reflect-trl rl`?)"
            ) from None
        except json.JSONDecodeError as err:
            raise UsageError(f"--runs {name}={run_dir}: unreadable log history ({err})") from None
    return runs


def _read_eval(path: str, decoding: str) -> list[dict[str, Any]]:
    from reflect_trl.errors import MissingPathError, UsageError

    if not Path(path).is_file():
        raise MissingPathError(
            f"--eval {path!r} does not exist (the results.json written by `reflect-trl eval`)"
        )
    try:
        results = json.loads(Path(path).read_text())["results"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise UsageError(f"--eval {path}: not a results.json of `reflect-trl eval` ({err})") from None
    decodings = sorted({r.get("decoding") for r in results})
    if decoding not in decodings:
        raise UsageError(f"--decoding {decoding!r}: {path} has results for {decodings}")
    return results


def plot_cli(argv: Sequence[str] | None = None) -> list[Path]:
    """``reflect-trl plot --runs name=outputs/x/rl,... --eval outputs/eval/results.json --output_dir outputs/plots``"""
    from reflect_trl.errors import UsageError

    parser = argparse.ArgumentParser(
        prog="reflect-trl plot",
        description="Learning curves of RL runs (curriculum stages shaded and named) and held-out success bars "
        "with 95 % Wilson intervals from `reflect-trl eval` results.",
    )
    parser.add_argument(
        "--runs",
        default="",
        help="RL runs to compare: comma-separated name=run_dir pairs (each an output_dir of `reflect-trl rl`), e.g. "
        "reflect=outputs/taxi/cpu/rl,plain=outputs/taxi/cpu/rl_plain -> learning_curves.png (and eval_curves.png "
        "when the runs evaluated during training)",
    )
    parser.add_argument(
        "--eval", default=None, help="results.json written by `reflect-trl eval` -> success_bars.png"
    )
    parser.add_argument(
        "--decoding",
        default="greedy",
        help="decoding of the success bars: greedy or sampled (default: greedy)",
    )
    parser.add_argument(
        "--key",
        default="env/success_rate",
        help="logged metric of the learning curves (default: env/success_rate)",
    )
    parser.add_argument("--window", type=int, default=5, help="moving-average window in logs (default: 5)")
    parser.add_argument("--no_stages", action="store_true", help="do not mark the curriculum stages")
    parser.add_argument(
        "--output_dir", default="outputs/plots", help="where the PNGs go (default: outputs/plots)"
    )
    args = parser.parse_args(argv)
    if not args.runs and not args.eval:
        parser.error("give --runs and/or --eval")
    if args.window < 1:
        parser.error(f"--window must be >= 1, got {args.window}")
    # Read and check every input before writing anything.
    runs = _read_runs(args.runs) if args.runs else {}
    if runs and not any(args.key in h for history in runs.values() for h in history):
        keys = sorted(
            {k for history in runs.values() for h in history for k in h if isinstance(h[k], int | float)}
        )
        raise UsageError(f"--key {args.key!r} was not logged by any run; logged keys: {keys}")
    results = _read_eval(args.eval, args.decoding) if args.eval else None
    written = []
    if runs:
        written.append(
            plot_learning_curves(
                runs,
                Path(args.output_dir) / "learning_curves.png",
                key=args.key,
                window=args.window,
                mark_stages=not args.no_stages,
            )
        )
    written += plot_eval_curves_if_logged(runs, Path(args.output_dir) / "eval_curves.png")
    if results is not None:
        written.append(
            plot_success_bars(results, Path(args.output_dir) / "success_bars.png", decoding=args.decoding)
        )
    for p in written:
        print(f"[plot] wrote {p}")
    return written
