"""``reflect-trl reproduce``: the demo pipeline for several seeds, pooled and compared."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from typing import Any


def reproduce_cli(argv: Sequence[str] | None = None) -> dict[str, Any]:
    from reflect_trl.cli.demo import parse_demo_overrides
    from reflect_trl.config_lists import parse_int_list

    argv = list(sys.argv[2:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="reflect-trl reproduce",
        description="The demo pipeline for several seeds, pooled held-out evaluation and paired comparisons "
        "(summary.json, results.md, plots under outputs/reproduce/<env>-<protocol>/).",
        epilog="Any DemoConfig field can be overridden for every seed: --rl_steps 120.",
    )
    parser.add_argument(
        "--seeds",
        nargs="+",
        default=["0", "1", "2", "3", "4"],
        help="one full run per seed: 0 1 2 or 0,1,2 (default: 0 1 2 3 4)",
    )
    parser.add_argument("--env_name", default="taxi", help="environment (default: %(default)s)")
    parser.add_argument("--output_dir", default=None, help="default: outputs/reproduce/<env_name>-<protocol>")
    parser.add_argument("--smoke", action="store_true", help="a handful of steps per stage (tests)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=0,
        help="worker processes (one thread each) of the pool that runs every seed's SFT, relabel, RL and "
        "evaluation jobs (default: the demo's jobs, 2)",
    )
    parser.add_argument(
        "--bootstrap_resamples",
        type=int,
        default=10_000,
        help="resamples of the paired bootstrap (default: 10000)",
    )
    parser.add_argument(
        "--rerun",
        action="store_true",
        help="run every seed again (default: reuse a seed whose finished run has the same configuration)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args, rest = parser.parse_known_args(argv)
    if args.no_progress:
        from reflect_trl.progress import disable_progress

        disable_progress()
    try:
        seeds = parse_int_list(",".join(args.seeds), "--seeds")
    except ValueError as err:
        parser.error(str(err))
    if not seeds or len(set(seeds)) != len(seeds):
        parser.error(f"--seeds {args.seeds}: give distinct integer seeds")
    if args.jobs < 0:
        parser.error(f"--jobs {args.jobs}: must be >= 1 (0: the demo's jobs)")
    overrides = parse_demo_overrides(rest, parser, exclude=("seed", "output_dir", "env_name"))
    from reflect_trl.pipelines.reproduce import (  # after --help: it imports torch
        ReproduceConfig,
        run_reproduce,
    )

    config = ReproduceConfig(
        seeds=seeds,
        env_name=args.env_name,
        output_dir=args.output_dir,
        smoke=args.smoke,
        bootstrap_resamples=args.bootstrap_resamples,
        jobs=args.jobs,
        rerun=args.rerun,
        demo_overrides=overrides,
    )
    # the command that regenerates this summary, with its own output folder
    recorded = [a for a in argv if a not in ("--rerun", "--no-progress")]
    if args.output_dir is None:
        recorded += ["--output_dir", str(config.out)]
    config.command = shlex.join(["reflect-trl", "reproduce", *recorded])
    return run_reproduce(config)
