"""``reflect-trl build-tiny``: a tiny offline model + tokenizer (tests, demo, benchmarks)."""

from __future__ import annotations

import argparse

DESCRIPTION = "build a tiny offline model + tokenizer (tests, demo, benchmarks)"


def build_tiny_cmd(argv: list[str]) -> None:
    from reflect_trl.config_lists import parse_list
    from reflect_trl.errors import usage_errors
    from reflect_trl.tiny_models import ARCHITECTURES, PRESETS, build_tiny_model
    from reflect_trl.validation import check_env

    parser = argparse.ArgumentParser(prog="reflect-trl build-tiny", description=DESCRIPTION)
    parser.add_argument(
        "--output_dir",
        default="models/tiny-gpt2",
        help="where the model + tokenizer are saved (default: %(default)s)",
    )
    parser.add_argument(
        "--arch",
        default="gpt2",
        choices=ARCHITECTURES,
        help="architecture (default: %(default)s; llama learns faster)",
    )
    parser.add_argument(
        "--preset",
        default="tiny",
        choices=sorted(PRESETS),
        help="size: "
        + ", ".join(f"{k} ({v['hidden']} hidden, {v['layers']} layers)" for k, v in PRESETS.items()),
    )
    parser.add_argument(
        "--envs",
        default="taxi",
        help="environments whose text trains the tokenizer: a comma-separated string or a JSON list (default: taxi)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the tokenizer corpus")
    args = parser.parse_args(argv)
    with usage_errors("--envs"):
        envs = parse_list(args.envs, "--envs") or ["taxi"]
    for name in envs:
        check_env(name, what="--envs")
    path = build_tiny_model(args.output_dir, args.arch, args.preset, args.seed, tuple(envs))
    print(f"tiny {args.arch} ({args.preset}) saved to {path}")
