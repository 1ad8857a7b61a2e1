"""``reflect-trl check-env NAME``: the contract of an environment, checked (:mod:`reflect_trl.envs.check`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from reflect_trl.envs.check import RANDOM_TOO_EASY, ContractReport

DESCRIPTION = (
    "Check that an environment keeps the contract reflect-trl relies on: the oracle solves every stage of every "
    "split, tasks are deterministic and JSON-safe, the options of a state come in one order, info['success'] is set "
    "on every step, splits are disjoint, instance_key and state_key are meaningful, the oracle reflector names the "
    "oracle's action, prompts fit the budget; and how often a random policy solves each stage. One line per check: "
    "PASS, FAIL (what and where), WARN or SKIP. Exit status 1 when a check failed (--strict: or warned)."
)


def check_env_cli(argv: Sequence[str] | None = None) -> ContractReport:
    """``reflect-trl check-env lock_puzzle [--stages one_dial ...] [--tasks 20] [--tokenizer models/tiny]``."""
    from reflect_trl.config_lists import parse_list
    from reflect_trl.envs.check import check_env_contract
    from reflect_trl.errors import UsageError, usage_errors
    from reflect_trl.validation import check_env, check_model_path

    parser = argparse.ArgumentParser(prog="reflect-trl check-env", description=DESCRIPTION)
    parser.add_argument("env_name", metavar="NAME", help="a registered environment (`reflect-trl envs`)")
    parser.add_argument("--env_kwargs", default=None, help="JSON object of environment kwargs")
    parser.add_argument("--stages", nargs="+", default=None, help="stages to check (default: all)")
    parser.add_argument(
        "--tasks", type=int, default=20, help="tasks played per split and stage (default: %(default)s)"
    )
    parser.add_argument(
        "--random_episodes",
        type=int,
        default=50,
        help="test tasks per stage played with a uniformly random legal action for the 'random policy' line, which "
        f"warns at {RANDOM_TOO_EASY * 100:.0f}%% success on a stage (0 skips it; default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the tasks (default: %(default)s)")
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="a model directory or hub id whose tokenizer counts prompt tokens (default: estimated from characters)",
    )
    parser.add_argument(
        "--max_prompt_tokens",
        type=int,
        default=1024,
        help="the longest policy prompt allowed (default: %(default)s, the tiny models' context)",
    )
    parser.add_argument("--strict", action="store_true", help="exit with status 1 on warnings too")
    args = parser.parse_args(argv)
    kwargs = {}
    if args.env_kwargs:
        with usage_errors("--env_kwargs"):
            kwargs = json.loads(args.env_kwargs)
        if not isinstance(kwargs, dict):
            raise UsageError(f"--env_kwargs {args.env_kwargs!r}: expected a JSON object")
    with usage_errors("--stages"):
        stages = parse_list(args.stages, "--stages")
    if args.tasks < 1:
        raise UsageError(f"--tasks {args.tasks}: must be >= 1")
    if args.random_episodes < 0:
        raise UsageError(
            f"--random_episodes {args.random_episodes}: must be >= 0 (0 skips the random policy)"
        )
    check_env(args.env_name, kwargs, stages, what="NAME")
    if args.tokenizer:
        check_model_path(args.tokenizer, "--tokenizer")
    report = check_env_contract(
        args.env_name,
        kwargs,
        stages=stages,
        n_tasks=args.tasks,
        seed=args.seed,
        tokenizer=args.tokenizer,
        max_prompt_tokens=args.max_prompt_tokens,
        random_episodes=args.random_episodes,
    )
    for line in report.lines():
        print(line)
    print(report.summary(), flush=True)
    failed = not report.ok or (args.strict and any(c.status == "WARN" for c in report.checks))
    if failed:
        raise SystemExit(1)
    return report
