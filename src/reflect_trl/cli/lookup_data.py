"""``reflect-trl lookup-data``: option-lookup warm-up data for a policy whose option list changes between states."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from reflect_trl.cli.relabel import check_data_output, check_policy_data


def check_lookup_inputs(dataset: str, output: str, copies: int) -> None:
    """Up-front checks (nothing is written before): policy data with reflections, a usable output path."""
    from reflect_trl.errors import UsageError

    if copies < 1:
        raise UsageError(f"--copies must be >= 1, got {copies}")
    check_policy_data(dataset)
    check_data_output(output)


def lookup_data_cli(argv: Sequence[str] | None = None) -> dict[str, int]:
    parser = argparse.ArgumentParser(
        prog="reflect-trl lookup-data",
        description=(
            "Option-lookup warm-up data: each policy row's reflection and its options in a random order (no state), "
            "the target label moved with its option. SFT a policy on it first where the option list changes between "
            "states, then the policy SFT from that model (docs/custom_environment.md)."
        ),
    )
    parser.add_argument(
        "--dataset", required=True, help="policy data with reflections (builder .jsonl or directory)"
    )
    parser.add_argument(
        "--output", required=True, help="output data set directory (a .jsonl copy is written beside)"
    )
    parser.add_argument("--copies", type=int, default=8, help="shuffled rows per train row (default: 8)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the option orders (default: 0)")
    args = parser.parse_args(argv)
    check_lookup_inputs(args.dataset, args.output, args.copies)
    from reflect_trl.data.lookup import write_lookup_dataset

    sizes = write_lookup_dataset(args.dataset, args.output, copies=args.copies, seed=args.seed)
    print(
        f"[lookup-data] {args.output} ({', '.join(f'{split} {n}' for split, n in sizes.items())}); "
        f"{Path(args.output).parent / Path(args.output).name}.jsonl"
    )
    return sizes
