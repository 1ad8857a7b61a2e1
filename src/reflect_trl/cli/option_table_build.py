"""Writes ``options.json``, the table of ``reflect-trl sft`` / ``rl`` options that ``--help`` and the recipe checks read
without importing torch (:mod:`reflect_trl.cli.option_table`). It imports the real parsers and the shipped recipes;
run ``python -m reflect_trl.cli.option_table_build --write`` after changing a config field or a shipped recipe (a test
fails while the table is stale)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reflect_trl.cli.option_table import (
    GROUPS,
    PER_RUN_KEYS,
    RECIPE_GLOBS,
    TABLE_FILE,
)
from reflect_trl.cli.recipes import own_fields, shown_option


def _parsers() -> dict[str, tuple[Any, str, tuple[type, ...]]]:
    """``{command: (its TrlParser, its description, the classes whose fields are reflect-trl's own)}``."""
    from reflect_trl.cli.rl import RL_DESCRIPTION, rl_parser
    from reflect_trl.cli.sft import SFT_DESCRIPTION, ReflectSFTScriptArguments, sft_parser
    from reflect_trl.trainers.rl_config import ReflectPPOConfig
    from reflect_trl.trainers.sft_config import ReflectSFTConfig

    return {
        "sft": (sft_parser(), SFT_DESCRIPTION, (ReflectSFTScriptArguments, ReflectSFTConfig)),
        "rl": (rl_parser(), RL_DESCRIPTION, (ReflectPPOConfig,)),
    }


def _type_name(action: argparse.Action) -> str | None:
    return {int: "int", float: "float"}.get(action.type)


def _format_value(value: Any) -> str:
    return json.dumps(value) if isinstance(value, list | dict) else str(value)


def recipe_values(command: str, root: Path, defaults: Mapping[str, Any]) -> dict[str, list[list[Any]]]:
    """``{key: [[value, [recipe, ...]], ...]}``: the values the shipped recipes of ``command`` set, for the keys where
    one of them differs from the default. A recipe is named by its directory (``taxi/cpu``; ``lock_puzzle`` for an
    example), plus its file name where the directory's recipes of this command disagree."""
    import yaml

    recipes: dict[Path, dict[str, Any]] = {}
    for pattern in RECIPE_GLOBS[command]:
        for path in sorted(root.glob(pattern)):
            recipes[path] = yaml.safe_load(path.read_text()) or {}

    def directory(path: Path) -> str:
        rel = path.parent.relative_to(root)
        return rel.parts[1] if rel.parts[0] == "examples" else "/".join(rel.parts[1:])

    found: dict[str, dict[str, list[Path]]] = {}
    for path, recipe in recipes.items():
        for key, value in recipe.items():
            if key in defaults and key not in PER_RUN_KEYS:
                found.setdefault(key, {}).setdefault(_format_value(value), []).append(path)

    def on_cpu(path: Path) -> bool:
        return path.parent.name == "cpu" or path.parts[len(root.parts)] == "examples"

    kinds = {
        "every CPU recipe": {directory(p) for p in recipes if on_cpu(p)},
        "every GPU recipe": {directory(p) for p in recipes if not on_cpu(p)},
    }
    out: dict[str, list[list[Any]]] = {}
    for key, by_value in found.items():
        if set(by_value) == {_format_value(defaults[key])}:
            continue  # every recipe keeps the default
        rows = []
        for value, paths in by_value.items():
            labels = []
            for path in paths:
                siblings = [p for p in recipes if p.parent == path.parent and key in recipes[p]]
                same = all(_format_value(recipes[p][key]) == value for p in siblings)
                labels.append(directory(path) if same else f"{directory(path)}/{path.stem}")
            labels = list(dict.fromkeys(labels))
            for kind, members in kinds.items():  # a whole kind in one word
                if len(members) > 1 and members <= set(labels):
                    labels = [kind] + [label for label in labels if label not in members]
            rows.append([value, labels])
        out[key] = rows
    return out


def build_table(root: Path | None = None) -> dict[str, Any]:
    """The table from the real parsers (and the shipped recipes under ``root``, the repository)."""
    root = root or Path(__file__).resolve().parents[3]
    table: dict[str, Any] = {"_generated_by": "python -m reflect_trl.cli.option_table_build --write"}
    for command, (parser, description, own) in _parsers().items():
        options: dict[str, dict[str, Any]] = {}
        first: dict[str, argparse.Action] = {}
        for action in parser._actions:
            if not action.option_strings or action.dest == "help":
                continue
            entry = options.setdefault(
                action.dest, {"flags": [], "type": _type_name(action), "choices": None}
            )
            entry["flags"] += [o for o in action.option_strings if o not in entry["flags"]]
            if action.dest not in first:
                first[action.dest] = action
                entry["choices"] = [str(c) for c in action.choices] if action.choices else None
        defaults = {dest: action.default for dest, action in first.items()}
        new, changed = own_fields(own)
        grouped: list[list[Any]] = []
        placed: set[str] = set()
        for title, names in GROUPS[command]:
            present = [n for n in names if n in first and n not in placed]
            placed.update(present)
            if present:
                grouped.append([title, present])
        rest = [n for n in new + changed if n in first and n not in placed]
        if rest:
            grouped.append([f"more options of reflect-trl {command}", rest])
            placed.update(rest)
        shown_names = [n for _, names in grouped for n in names]
        values = recipe_values(command, root, defaults)
        help_entries = {}
        for name in shown_names:
            shown = shown_option(first[name])
            help_entries[name] = {
                "flags": shown["flags"],
                "metavar": shown["metavar"],
                "help": shown["help"],
                "default": shown["default"],
                "recipes": values.get(name, []),
            }
        table[command] = {
            "description": description,
            "groups": grouped,
            "hidden": len(options) - len(shown_names),
            "help": help_entries,
            "options": options,
        }
    return table


def render_table(table: Mapping[str, Any]) -> str:
    return json.dumps(table, indent=1, sort_keys=False, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reflect_trl.cli.option_table_build", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--write", action="store_true", help=f"write {TABLE_FILE.name}")
    args = parser.parse_args(argv)
    text = render_table(build_table())
    if args.write:
        TABLE_FILE.write_text(text, encoding="utf-8")
        print(f"wrote {TABLE_FILE}")
        return 0
    current = TABLE_FILE.read_text(encoding="utf-8") if TABLE_FILE.is_file() else ""
    print("up to date" if current == text else f"{TABLE_FILE.name} is stale: run with --write")
    return 0 if current == text else 1


__all__ = ["build_table", "main", "render_table"]


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
