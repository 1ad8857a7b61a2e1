"""The options of ``reflect-trl sft`` and ``reflect-trl rl`` without importing torch: ``--help`` and recipe checks
in a fraction of a second.

Their configs subclass TRL's (``ReflectPPOConfig`` is a ``trl.GRPOConfig``), and importing them imports torch and
TRL (about 8 s). The command line needs only the names, types and help of the options, so they are kept in
``options.json`` next to this module, generated from the real parsers (with the values the shipped recipes set)::

    python -m reflect_trl.cli.option_table_build --write   # after changing a config field, its help or a shipped recipe

``tests/cli/test_option_table.py`` regenerates the table and fails while ``options.json`` differs, so it cannot go
stale. :func:`precheck` runs before a command is imported: ``--help`` prints the grouped help from the table, and a
recipe's keys and values and the command line's flags are checked against it (the same checks and messages as
:mod:`reflect_trl.cli.recipes` with the real parser). ``--help-all`` builds the real parser.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from reflect_trl.cli.recipes import (
    OptionSpec,
    check_flags,
    expand_config,
    grouped_help_parser,
    parser_options,
    read_recipe,
    usage_line,
)
from reflect_trl.cli.recipes import short_help as parser_help
from reflect_trl.errors import usage_errors

TABLE_FILE = Path(__file__).with_name("options.json")
#: The commands whose options are in the table.
TABLE_COMMANDS = ("sft", "rl")

#: The groups of ``reflect-trl <command> --help``, in order: (title, option names). Options of a command that no
#: group names go to a last group "more options of reflect-trl <command>" (reflect-trl's own fields) or stay in
#: ``--help-all`` (inherited TRL/transformers options).
GROUPS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "rl": (
        (
            "model and run",
            ("model_name_or_path", "output_dir", "seed", "use_cpu", "bf16", "dtype", "use_peft", "lora_r")
            + ("load_in_8bit", "load_in_4bit", "resume_from_checkpoint"),
        ),
        (
            "environment",
            ("env_name", "env_kwargs", "eval_env_kwargs", "num_train_tasks", "task_seed", "train_tasks_file")
            + ("option_labels", "shuffle_options", "max_prompt_length"),
        ),
        (
            "reflection",
            ("reflection_model_name_or_path", "reflection_max_new_tokens", "reflection_temperature")
            + ("reflection_cache_size", "reflection_dtype", "reflection_device", "reflection_load_in_8bit")
            + (
                "reflection_load_in_4bit",
                "reflection_backend",
                "reflection_base_url",
                "reflection_server_model",
            )
            + ("train_reflection", "train_policy", "reflection_learning_rate", "reflection_beta")
            + ("reflection_reward", "reflection_verified_weight", "reflection_no_move_penalty")
            + ("reflection_objective",)
            + (
                "reflection_api_key_env",
                "reflection_concurrency",
                "reflection_timeout",
                "reflection_max_retries",
            ),
        ),
        (
            "RL",
            (
                "max_steps",
                "learning_rate",
                "lr_scheduler_type",
                "lr_schedule_per_stage",
                "per_device_train_batch_size",
                "num_generations",
            )
            + ("gradient_accumulation_steps", "num_iterations", "advantage_estimator", "gamma", "gae_lambda")
            + ("step_advantage_weight", "scale_rewards", "scale_std_floor", "reinforce_baseline")
            + ("whiten_advantages", "beta", "skip_no_signal_steps", "temperature", "vf_coef", "value_clip")
            + ("replay_buffer_size", "replay_samples", "replay_weight")
            + ("loss_type", "max_completion_length", "disable_dropout"),
        ),
        (
            "curriculum",
            ("curriculum", "curriculum_stages", "curriculum_schedule", "curriculum_stage_starts")
            + ("curriculum_threshold", "curriculum_window"),
        ),
        (
            "logging, evaluation and checkpoints",
            ("logging_steps", "log_episodes_every", "num_logged_episodes", "report_to", "run_name")
            + ("eval_strategy", "eval_steps", "eval_on_start", "eval_episodes_per_stage", "eval_split")
            + ("eval_seed", "num_generations_eval", "per_device_eval_batch_size", "load_best_model_at_end")
            + ("save_strategy", "save_steps"),
        ),
        ("speed and memory", ("ref_logps_memo_size", "shared_prefix_min_tokens")),
    ),
    "sft": (
        (
            "model and run",
            ("model_name_or_path", "output_dir", "seed", "use_cpu", "bf16", "dtype", "use_peft", "lora_r")
            + ("load_in_8bit", "load_in_4bit", "resume_from_checkpoint"),
        ),
        (
            "data",
            ("dataset_path", "eval_dataset_path", "dataset_train_split", "dataset_eval_split", "env_name")
            + ("max_train_samples", "max_eval_samples", "curriculum_order", "stages", "max_length")
            + ("match_oracle_labels_of",),
        ),
        ("role", ("role", "option_labels")),
        (
            "training",
            ("max_steps", "num_train_epochs", "learning_rate", "lr_scheduler_type", "warmup_steps")
            + ("warmup_ratio", "per_device_train_batch_size", "gradient_accumulation_steps"),
        ),
        (
            "evaluation, logging and checkpoints",
            ("eval_strategy", "eval_steps", "eval_on_start", "per_device_eval_batch_size")
            + ("eval_num_policy_samples", "eval_num_reflection_samples", "reflection_max_new_tokens")
            + ("reflection_do_sample", "metrics_file", "logging_steps", "report_to", "run_name")
            + ("load_best_model_at_end", "save_strategy", "save_steps"),
        ),
        ("speed and memory", ("shared_prefix_min_tokens",)),
    ),
}
#: Recipe keys that name this run's paths, not a setting to recommend: their recipe values are not listed.
PER_RUN_KEYS = (
    "model_name_or_path",
    "reflection_model_name_or_path",
    "output_dir",
    "dataset_path",
    "eval_dataset_path",
    "env_name",
    "env_kwargs",
    "run_name",
    "seed",
    "sft_anchor_data",
    "curriculum_stage_starts",
    "lora_target_modules",
)
#: Recipes whose values ``--help`` shows: ``{command: (glob, ...)}`` relative to the repository.
RECIPE_GLOBS: dict[str, tuple[str, ...]] = {
    "rl": ("recipes/*/cpu/rl.yaml", "recipes/*/rl.yaml", "examples/*/recipes/rl.yaml"),
    "sft": ("recipes/*/cpu/sft_*.yaml", "recipes/*/sft_*.yaml", "examples/*/recipes/sft_*.yaml"),
}
RECIPES_NOTE = (
    "'recipes:' lists what the shipped recipes set, the recommended starting points: recipes/<env>/cpu (tiny models "
    "on a CPU), recipes/<env> (real models on GPUs), examples/<name>/recipes. Every option is also a recipe key "
    "(YAML), and a flag overrides the recipe."
)


# -- reading the table (no torch) ----------------------------------------------------------------------------
@cache
def load_table() -> dict[str, Any]:
    """The table of ``options.json`` (``{command: {...}}``)."""
    return json.loads(TABLE_FILE.read_text(encoding="utf-8"))


def _shown_help(entry: Mapping[str, Any]) -> str:
    text = (entry.get("help") or "").strip()
    extras = []
    if entry.get("default") is not None:
        extras.append(f"default: {entry['default']}")
    if entry.get("recipes"):
        values = "; ".join(f"{value} ({', '.join(labels)})" for value, labels in entry["recipes"])
        extras.append(f"recipes: {values}")
    if extras:
        text = f"{text} ({'; '.join(extras)})".strip()
    return text.replace("%", "%%") or " "


def short_help(command: str, table: Mapping[str, Any] | None = None) -> str:
    """The grouped ``--help`` of ``command`` from the table."""
    spec = (table or load_table())[command]
    parser = grouped_help_parser(
        command,
        spec["description"],
        f"{spec['hidden']} more options inherited from TRL/transformers: `reflect-trl {command} --help-all`. "
        + RECIPES_NOTE,
    )
    for title, names in spec["groups"]:
        group = parser.add_argument_group(title)
        for name in names:
            entry = spec["help"][name]
            group.add_argument(*entry["flags"], dest=name, metavar=entry["metavar"], help=_shown_help(entry))
    return parser.format_help()


def recipe_options(command: str) -> dict[str, OptionSpec]:
    """``{dest: OptionSpec}`` of ``command`` from the table."""
    return {
        dest: OptionSpec(dest, tuple(o["flags"]), o["type"], tuple(o["choices"]) if o["choices"] else None)
        for dest, o in load_table()[command]["options"].items()
    }


def precheck(command: str, argv: Sequence[str]) -> bool:
    """Before ``command`` is imported: print its ``--help`` from the table (True: done), or check the recipe of
    ``--config`` and the flags against it (raises :class:`~reflect_trl.errors.UsageError`; False: go on)."""
    if command not in TABLE_COMMANDS:
        return False
    args = list(argv)
    if "--help-all" in args:
        return False  # the real parser prints every option
    if "-h" in args or "--help" in args:
        print(short_help(command))
        return True
    options = recipe_options(command)
    args, recipe = expand_config(args)
    if recipe is not None:
        read_recipe(recipe, options, command)
    check_flags(args, options, command)
    return False


__all__ = [
    "GROUPS",
    "TABLE_COMMANDS",
    "load_table",
    "parse_recipe",
    "precheck",
    "recipe_options",
    "short_help",
]


def parse_recipe(
    parser,
    argv: Sequence[str] | None,
    command: str,
    description: str,
    own: Sequence[type],
) -> tuple[Any, ...]:
    """``parser.parse_args_and_config(argv)`` (a ``TrlParser``) with the grouped help (the table's for ``sft`` / ``rl``)
    and the checks of :mod:`reflect_trl.cli.recipes`."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    parser.prog = f"reflect-trl {command}"
    parser.description = description
    parser.usage = usage_line(command)
    if "--help-all" in args:
        parser.print_help()
        raise SystemExit(0)
    if "-h" in args or "--help" in args:
        print(
            short_help(command)
            if command in TABLE_COMMANDS
            else parser_help(parser, command, description, own)
        )
        raise SystemExit(0)
    args, recipe = expand_config(args)
    options = parser_options(parser)
    if recipe is not None:
        read_recipe(recipe, options, command)
    check_flags(args, options, command)
    with usage_errors("invalid setting"):
        return parser.parse_args_and_config(args=args)
