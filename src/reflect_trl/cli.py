"""The ``reflect-trl`` command line: thin dispatch to the library's entry points.

Every training subcommand parses ``--config recipe.yaml`` plus CLI overrides with ``trl.TrlParser`` and runs
unchanged under ``accelerate launch -m reflect_trl.cli <subcommand> ...``.

Errors (:mod:`reflect_trl.errors`): bad input ends with one line ``reflect-trl <command>: error: ...`` and exit status
2, a runtime failure with one line and status 1; ``reflect-trl --debug <command>`` (or ``REFLECT_TRL_DEBUG=1``) adds
the traceback. ``--no-progress`` turns the progress bars off (they are off anyway when stderr is not a terminal).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import sys
import traceback
import warnings
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
    "relabel": (
        "policy SFT data with the SFT'd reflection model's own reflections (targets unchanged)",
        "reflect_trl.model_reflections:relabel_cli",
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
    "reproduce": (
        "the demo for several seeds: pooled held-out table, paired comparisons, plots",
        "reflect_trl.reproduce:reproduce_cli",
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
    from reflect_trl.config_lists import parse_list
    from reflect_trl.errors import usage_errors
    from reflect_trl.tiny_models import ARCHITECTURES, PRESETS, build_tiny_model
    from reflect_trl.validation import check_env

    parser = argparse.ArgumentParser(prog="reflect-trl build-tiny", description=COMMANDS["build-tiny"][0])
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


def _resolve(target: str) -> Callable[[list[str]], object]:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


#: Options of ``reflect-trl`` itself, given before the command.
GLOBAL_OPTIONS = {
    "--debug": "print the traceback of an error (also: REFLECT_TRL_DEBUG=1)",
    "--no-progress": "no progress bars (they are off anyway when stderr is not a terminal)",
}
#: FutureWarnings that TRL 1.16 triggers inside transformers 5.24 (its own calls of renamed methods); nothing a
#: reflect-trl user can change. Matched by message, so any other warning still shows.
_DEPENDENCY_DEPRECATIONS = (
    "`is_gradient_checkpointing` is deprecated",
    "`gradient_checkpointing_disable` is deprecated",
    "`gradient_checkpointing_enable` is deprecated",
)


def quiet_dependencies() -> None:
    """Silence import-time notices of optional kernels and the dependency deprecations above.

    bitsandbytes (imported by peft at import time) logs that its optional CPU 4-bit kernel package ``kernels`` is
    missing; reflect-trl loads 4-bit models only when a recipe asks for it, so the notice is noise."""
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    for message in _DEPENDENCY_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)


def _usage() -> str:
    width = max(map(len, COMMANDS))
    listing = "\n".join(f"  {name:{width}s}  {help_}" for name, (help_, _) in COMMANDS.items())
    options = "\n".join(f"  {flag:{width}s}  {help_}" for flag, help_ in GLOBAL_OPTIONS.items())
    return (
        f"usage: reflect-trl [--debug] [--no-progress] <command> [options]\n\ncommands:\n{listing}\n\n"
        f"options (before the command):\n{options}\n\nRun `reflect-trl <command> --help` for a command's options."
    )


def _report(command: str, err: BaseException, debug: bool) -> int:
    """Print one ``reflect-trl <command>: error: ...`` line (after the traceback under --debug); the exit status."""
    from reflect_trl.errors import describe, is_usage_error

    if debug:
        traceback.print_exception(err)
    usage = is_usage_error(err)
    message = describe(err) if usage else f"{type(err).__name__}: {describe(err)}"
    hint = "" if debug else f" (traceback: reflect-trl --debug {command} ...)"
    print(f"reflect-trl {command}: error: {message}{'' if usage else hint}", file=sys.stderr, flush=True)
    return 2 if usage else 1


def main(argv: list[str] | None = None) -> int:
    from reflect_trl.errors import DEBUG_ENV, debug_enabled
    from reflect_trl.progress import disable_progress, progress_enabled

    argv = list(sys.argv[1:] if argv is None else argv)
    while argv and argv[0] in GLOBAL_OPTIONS:
        flag = argv.pop(0)
        if flag == "--debug":
            os.environ[DEBUG_ENV] = "1"
        else:
            disable_progress()
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        from reflect_trl import __version__

        print(__version__)
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, list(COMMANDS) + list(GLOBAL_OPTIONS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(
            f"reflect-trl: error: unknown command {command!r}{hint}; commands: {', '.join(COMMANDS)} "
            "(reflect-trl --help)",
            file=sys.stderr,
        )
        return 2
    quiet_dependencies()
    if not progress_enabled():  # the bars of transformers (loading weights) and datasets (map) too
        for variable in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS"):
            os.environ.setdefault(variable, "1")
    try:
        _resolve(COMMANDS[command][1])(rest)
    except SystemExit as exit_:  # argparse: its message is printed already
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    except KeyboardInterrupt:
        print(f"reflect-trl {command}: interrupted", file=sys.stderr)
        return 130
    except (
        BrokenPipeError
    ):  # the reader closed the pipe (`| head`, `| grep -q`): stop quietly, like SIGPIPE does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not raise again
        return 141
    except Exception as err:
        return _report(command, err, debug_enabled())
    return 0


if __name__ == "__main__":
    sys.exit(main())
