"""The ``reflect-trl`` command line: thin dispatch to the library's entry points.

Every training subcommand parses ``--config recipe.yaml`` plus CLI overrides with ``trl.TrlParser`` and runs
unchanged under ``accelerate launch -m reflect_trl.cli <subcommand> ...``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

# name -> (help, "module:function"); each function takes the remaining argv.
COMMANDS: dict[str, tuple[str, str]] = {
    "envs": ("list the registered environments and their curriculum stages", "reflect_trl.cli:list_envs_cmd"),
    "build-tiny": (
        "build a tiny offline model + tokenizer (tests, demo, benchmarks)",
        "reflect_trl.cli:build_tiny_cmd",
    ),
    "data": (
        "generate reflection/policy SFT datasets with negative examples",
        "reflect_trl.data_builder:build_datasets_cli",
    ),
    "sft": (
        "SFT warm-up of the policy or the reflection model (ReflectSFTTrainer)",
        "reflect_trl.trainers.sft:run_sft_cli",
    ),
    "rl": ("online two-player RL of the policy (ReflectPPOTrainer)", "reflect_trl.trainers.rl:run_rl"),
    "eval": (
        "evaluate policies (with or without reflection) on held-out episodes",
        "reflect_trl.evaluation:eval_cli",
    ),
    "plot": (
        "plot learning curves and success bars from runs and eval results",
        "reflect_trl.plotting:plot_cli",
    ),
    "demo": (
        "the whole method end to end on tiny models (variants, table, plots)",
        "reflect_trl.demo:demo_cli",
    ),
}


def list_envs_cmd(argv: list[str]) -> None:
    from reflect_trl.envs import get_env_class, list_envs

    argparse.ArgumentParser(prog="reflect-trl envs", description=COMMANDS["envs"][0]).parse_args(argv)
    for name in list_envs():
        try:
            stages = ", ".join(get_env_class(name).stages)
        except ImportError as err:  # optional extra not installed
            stages = f"unavailable ({err})"
        print(f"{name:14s} {stages}")


def build_tiny_cmd(argv: list[str]) -> None:
    from reflect_trl.tiny_models import ARCHITECTURES, PRESETS, build_tiny_model

    parser = argparse.ArgumentParser(prog="reflect-trl build-tiny", description=COMMANDS["build-tiny"][0])
    parser.add_argument("--output_dir", default="models/tiny-gpt2")
    parser.add_argument("--arch", default="gpt2", choices=ARCHITECTURES)
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument(
        "--envs", default="taxi", help="comma-separated environments whose text trains the tokenizer"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = build_tiny_model(args.output_dir, args.arch, args.preset, args.seed, tuple(args.envs.split(",")))
    print(f"tiny {args.arch} ({args.preset}) saved to {path}")


def _resolve(target: str) -> Callable[[list[str]], object]:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    width = max(map(len, COMMANDS))
    listing = "\n".join(f"  {name:{width}s}  {help_}" for name, (help_, _) in COMMANDS.items())
    usage = f"usage: reflect-trl <command> [options]\n\ncommands:\n{listing}\n\nRun `reflect-trl <command> --help` for a command's options."
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0
    if argv[0] == "--version":
        from reflect_trl import __version__

        print(__version__)
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(
            f"reflect-trl: unknown command {command!r}; known commands: {', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return 2
    _resolve(COMMANDS[command][1])(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
