"""The command line of the ``TrlParser`` subcommands (``data``, ``sft``, ``rl``): ``--config recipe.yaml`` + flags.

* ``--help`` shows the command's description, ``--config`` and the options reflect-trl defines, then the common
  TRL/transformers ones; ``--help-all`` shows every inherited option as well. :func:`reflect_trl.cli.option_table.
  parse_recipe` puts it together (``sft`` and ``rl``: the grouped help of the option table, without importing torch).
* A missing recipe file, invalid YAML, an unknown recipe key or flag, a value of the wrong type and a setting that
  the config classes reject (their ``__post_init__`` checks) are :class:`~reflect_trl.errors.UsageError` naming the
  file, key or flag and what to do.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reflect_trl.errors import MissingPathError, UsageError

#: Inherited options shown by the short ``--help`` (when the command has them), in this order.
COMMON_OPTIONS: tuple[str, ...] = (
    "model_name_or_path",
    "output_dir",
    "max_steps",
    "num_train_epochs",
    "learning_rate",
    "lr_scheduler_type",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_iterations",
    "beta",
    "temperature",
    "max_length",
    "seed",
    "use_cpu",
    "bf16",
    "dtype",
    "logging_steps",
    "eval_strategy",
    "eval_steps",
    "eval_on_start",
    "load_best_model_at_end",
    "save_strategy",
    "save_steps",
    "resume_from_checkpoint",
    "report_to",
    "run_name",
    "use_peft",
    "lora_r",
    "load_in_8bit",
    "load_in_4bit",
)
#: Keys of a recipe that are not options: TRL reads ``env`` as environment variables to set.
RESERVED_KEYS = ("env",)
#: Deprecated aliases left out of the short help.
HIDDEN_OPTIONS = ("gradient_checkpointing",)


def usage_line(command: str) -> str:
    return f"reflect-trl {command} [--config RECIPE.yaml] [--OPTION VALUE ...]  (--help, --help-all)"


@dataclasses.dataclass(frozen=True)
class OptionSpec:
    """What the checks need of one option: its name (the recipe key), every flag that sets it, its value type
    (``"int"``, ``"float"`` or None for anything else) and its choices (None: any value)."""

    dest: str
    flags: tuple[str, ...]
    type: str | None = None
    choices: tuple[str, ...] | None = None


def parser_options(parser: argparse.ArgumentParser) -> dict[str, OptionSpec]:
    """``{dest: OptionSpec}`` of a parser (the type and choices of the first action of each dest)."""
    flags: dict[str, list[str]] = {}
    first: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            flags.setdefault(action.dest, []).extend(action.option_strings)
            first.setdefault(action.dest, action)
    return {
        dest: OptionSpec(
            dest,
            tuple(dict.fromkeys(flags[dest])),
            {int: "int", float: "float"}.get(action.type),
            tuple(str(c) for c in action.choices) if action.choices else None,
        )
        for dest, action in first.items()
    }


def own_fields(classes: Sequence[type]) -> tuple[list[str], list[str]]:
    """(fields reflect-trl adds, inherited fields whose default reflect-trl changes), in declaration order."""
    new: list[str] = []
    changed: list[str] = []
    for cls in classes:
        inherited = {
            f.name
            for base in cls.__mro__[1:]
            if dataclasses.is_dataclass(base)
            for f in dataclasses.fields(base)
        }
        for name in cls.__dict__.get("__annotations__", {}):
            target = changed if name in inherited else new
            if name not in new + changed and name not in HIDDEN_OPTIONS:
                target.append(name)
    return new, changed


def _metavar(action: argparse.Action) -> str:
    if action.choices:
        return "{" + ",".join(map(str, action.choices)) + "}"
    if action.nargs == "?" and action.const is True:
        return "BOOL"
    return {int: "INT", float: "FLOAT"}.get(action.type, "VALUE") + (" ..." if action.nargs == "+" else "")


def shown_option(action: argparse.Action) -> dict[str, Any]:
    """How ``--help`` shows an option: its underscore flags, a short metavar, its help and its default (or None)."""
    flags = [o for o in action.option_strings if "-" not in o[2:]] or action.option_strings[:1]
    default = action.default
    text = (action.help or "").strip()
    shown_default = None
    if default not in (None, "", [], argparse.SUPPRESS, dataclasses.MISSING) and "%(default)" not in text:
        shown_default = str(default)
    return {"flags": flags, "metavar": _metavar(action), "help": text, "default": shown_default}


def _shown(action: argparse.Action) -> argparse.Action:
    """A compact copy of ``action`` (underscore spelling, short metavar) whose help ends with its default."""
    option = shown_option(action)
    shown = copy.copy(action)
    shown.option_strings = option["flags"]
    shown.metavar = option["metavar"]
    shown.nargs = None
    text = option["help"]
    if option["default"] is not None:
        text = f"{text} (default: {option['default'].replace('%', '%%')})".strip()
    shown.help = text or " "
    return shown


def grouped_help_parser(command: str, description: str, epilog: str) -> argparse.ArgumentParser:
    """The parser that prints a grouped ``--help``: usage, description, the ``usage`` group; callers add theirs."""
    parser = argparse.ArgumentParser(
        prog=f"reflect-trl {command}",
        usage=usage_line(command),
        description=textwrap.fill(description, width=100),
        epilog=epilog,
        add_help=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    basics = parser.add_argument_group("usage")
    basics.add_argument("-h", "--help", action="store_true", help="this help")
    basics.add_argument("--help-all", action="store_true", help="every option, the inherited ones included")
    basics.add_argument(
        "--config",
        metavar="RECIPE.yaml",
        help="a YAML recipe: keys are option names (e.g. recipes/taxi/cpu/*.yaml); flags override its values",
    )
    return parser


def short_help(parser: argparse.ArgumentParser, command: str, description: str, own: Sequence[type]) -> str:
    """The ``--help`` text: description, ``--config``, reflect-trl's options, the common inherited ones."""
    by_dest: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if action.option_strings and action.dest not in by_dest and action.dest != "help":
            by_dest[action.dest] = action
    new, changed = own_fields(own)
    own_names = [n for n in new if n in by_dest]
    common = [n for n in [*changed, *COMMON_OPTIONS] if n in by_dest and n not in own_names]
    common = list(dict.fromkeys(common))
    hidden = len(by_dest) - len(own_names) - len(common)
    help_parser = grouped_help_parser(
        command,
        description,
        (
            f"{hidden} more options inherited from TRL/transformers: `reflect-trl {command} --help-all`. "
            if hidden
            else ""
        )
        + "Every option is also a recipe key (YAML), and a flag overrides the recipe.",
    )
    for title, names in (
        (f"options of reflect-trl {command}", own_names),
        ("common TRL/transformers options (and those whose default reflect-trl changes)", common),
    ):
        group = help_parser.add_argument_group(title)
        for name in names:
            group._group_actions.append(_shown(by_dest[name]))
    return help_parser.format_help()


def _suggest(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def _check_value_type(option: OptionSpec, key: str, value: Any, where: str) -> None:
    """A recipe value that argparse would convert (int/float options) must convert."""
    if option.type in ("int", "float") and isinstance(value, str):
        convert = int if option.type == "int" else float
        try:
            convert(value)
        except ValueError:
            raise UsageError(f"{where}: {key}: {value!r} is not a valid {option.type}") from None
    choices = list(option.choices or ())
    if choices and value is not None and not isinstance(value, list) and str(value) not in choices:
        raise UsageError(f"{where}: {key}: {value!r} is not one of {choices}")


def _options(parser_or_options) -> dict[str, OptionSpec]:
    if isinstance(parser_or_options, argparse.ArgumentParser):
        return parser_options(parser_or_options)
    return dict(parser_or_options)


def read_recipe(path: str, options, command: str) -> dict[str, Any]:
    """Load and check a recipe file: it exists, is YAML, is a mapping, and every key is an option of ``command``
    (``options``: a parser or ``{dest: OptionSpec}``)."""
    import yaml

    recipe = Path(path).expanduser()
    if not recipe.exists():
        raise MissingPathError(f"recipe file {path!r} does not exist (--config takes a YAML file)")
    if recipe.is_dir():
        raise UsageError(f"--config {path!r} is a directory; give a YAML recipe file")
    try:
        raw = yaml.safe_load(recipe.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UsageError(f"{path}{where}: invalid YAML ({problem}); fix the file") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: a recipe is a YAML mapping of option: value, got a {type(raw).__name__}")
    specs = _options(options)
    if "env" in raw and not isinstance(raw["env"], dict):
        raise UsageError(
            f"{path}: key 'env' holds environment variables to set (a mapping); the environment is 'env_name'"
        )
    unknown = [str(k) for k in raw if k not in specs and k not in RESERVED_KEYS]
    if unknown:
        hints = "; ".join(f"{k!r}{_suggest(k, list(specs))}" for k in unknown)
        raise UsageError(
            f"{path}: unknown key(s) {hints}; `reflect-trl {command} --help-all` lists every key"
        )
    for key, value in raw.items():
        if key in specs:
            _check_value_type(specs[key], key, value, path)
    return raw


def check_flags(argv: Sequence[str], options, command: str) -> None:
    """Every ``--flag`` on the command line is an option of ``command`` (``options``: a parser or
    ``{dest: OptionSpec}``); the value after ``--config`` is not a flag."""
    known = {flag for spec in _options(options).values() for flag in spec.flags} | {"--config", "--help-all"}
    args = list(argv)
    for i, token in enumerate(args):
        if not token.startswith("--") or (i > 0 and args[i - 1] == "--config"):
            continue
        flag = token.split("=", 1)[0]
        if flag not in known:
            raise UsageError(
                f"unknown option {flag}{_suggest(flag, sorted(known))}; `reflect-trl {command} --help` lists the "
                f"options (`--help-all`: every one)"
            )


def expand_config(argv: Sequence[str]) -> tuple[list[str], str | None]:
    """``argv`` with ``--config=PATH`` split in two (TrlParser only understands ``--config PATH``), and the recipe
    path (None without ``--config``)."""
    args: list[str] = []
    for token in argv:
        args += token.split("=", 1) if token.startswith("--config=") else [token]
    if "--config" not in args:
        return args, None
    index = args.index("--config")
    if index + 1 >= len(args) or args[index + 1].startswith("--"):
        raise UsageError("--config needs a YAML recipe file, e.g. --config recipes/taxi/cpu/rl.yaml")
    return args, args[index + 1]


__all__ = [
    "COMMON_OPTIONS",
    "OptionSpec",
    "check_flags",
    "expand_config",
    "own_fields",
    "parser_options",
    "read_recipe",
    "grouped_help_parser",
    "short_help",
    "shown_option",
]
