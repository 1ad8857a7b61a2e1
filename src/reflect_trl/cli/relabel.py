"""``reflect-trl relabel``: policy SFT data with the SFT'd reflection model's own reflections."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reflect_trl.data.io import available_splits, load_sft_dataset
from reflect_trl.data.relabel import relabel_dataset, split_policy_prompt


def check_relabel_inputs(
    dataset: str, reflection_model: str, output: str, temperature: float, max_new_tokens: int
) -> None:
    """Up-front checks of ``reflect-trl relabel`` (nothing is loaded or written before): the data set is policy data
    with reflections, the reflection model path, the output path and the generation settings."""
    from reflect_trl.errors import UsageError
    from reflect_trl.validation import check_model_path

    if temperature < 0:
        raise UsageError(f"--temperature must be >= 0, got {temperature}")
    if max_new_tokens < 1:
        raise UsageError(f"--max_new_tokens must be >= 1, got {max_new_tokens}")
    check_policy_data(dataset)
    check_model_path(reflection_model, "--reflection_model")
    check_data_output(output)


def check_policy_data(dataset: str) -> None:
    """``--dataset`` is policy data with reflections (every split's first row is checked)."""
    from reflect_trl.errors import usage_errors

    with usage_errors("--dataset"):
        for split in available_splits(dataset) or ["train"]:
            rows = load_sft_dataset(dataset, split)
            if len(rows):
                split_policy_prompt(rows[0]["prompt"])


def check_data_output(output: str) -> None:
    """``--output`` is new or a saved data set (which is replaced): never a foreign folder."""
    from reflect_trl.errors import UsageError

    out = Path(output)
    if out.exists() and not (out / "dataset_dict.json").is_file():
        raise UsageError(f"--output {output} exists and is not a saved data set; choose another --output")


def relabel_cli(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="reflect-trl relabel",
        description="Policy SFT data with the SFT'd reflection model's own reflections (targets unchanged).",
    )
    parser.add_argument(
        "--dataset", required=True, help="policy data with reflections (builder .jsonl or directory)"
    )
    parser.add_argument(
        "--reflection_model", required=True, help="the SFT'd reflection model (local dir or hub id)"
    )
    parser.add_argument(
        "--output", required=True, help="output data set directory (a .jsonl copy is written beside)"
    )
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="0 = greedy reflections (as in evaluation)"
    )
    parser.add_argument(
        "--max_new_tokens", type=int, default=64, help="token budget of one reflection (default: 64)"
    )
    parser.add_argument(
        "--replace", action="store_true", help="drop the oracle-reflection rows (default: keep them)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of sampled reflections (default: 0)")
    args = parser.parse_args(argv)
    check_relabel_inputs(
        args.dataset, args.reflection_model, args.output, args.temperature, args.max_new_tokens
    )
    stats = relabel_dataset(
        args.dataset,
        args.reflection_model,
        args.output,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        keep_oracle_rows=not args.replace,
        seed=args.seed,
    )
    for split, s in stats.items():
        print(
            f"[relabel] {split}: {s['rows']} rows ({s['model_rows']} with model reflections; "
            f"{100 * s['model_reflection_names_target']:.1f} % of them name the target action)"
        )
    return stats
