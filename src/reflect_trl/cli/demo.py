"""``reflect-trl demo``: the demo's command line (defaults, a ``--config`` file, ``--field value`` overrides)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from reflect_trl.pipelines.demo import DemoConfig, check_demo_config, finish_pooled_demo, run_demo
from reflect_trl.pipelines.protocols import env_demo_settings


def _parse_field(key: str, current: Any, value: str, parser: argparse.ArgumentParser) -> Any:
    """A ``--field value`` override as the field's type (JSON for the kwargs dicts)."""
    try:
        if key.endswith("env_kwargs") or isinstance(current, dict):
            parsed = json.loads(value)
            if not isinstance(parsed, dict):
                raise ValueError("expected a JSON object")
            return parsed
        if isinstance(current, bool):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError("expected true or false")
            return value.lower() in ("true", "1")
        annotation = str(DemoConfig.__dataclass_fields__[key].type)
        if isinstance(current, list) or annotation.startswith("list"):
            from reflect_trl.config_lists import parse_list

            if current is None and value.lower() == "none":
                return None
            return parse_list(value, f"--{key}") or []
        # an optional field ("int | None", "float | None", "str | None"): "none" gives None
        if "None" in annotation:
            if value.lower() == "none":
                return None
            kind = {"int": int, "float": float}.get(annotation.split("|")[0].strip(), str)
            return kind(value)
        return type(current)(value)
    except ValueError as err:
        parser.error(f"--{key} {value!r}: {err}")


def parse_demo_overrides(
    rest: Sequence[str], parser: argparse.ArgumentParser, exclude: Sequence[str] = ()
) -> dict[str, Any]:
    """``--field value`` overrides of any :class:`DemoConfig` field, typed like the field."""
    fields = {k: v for k, v in DemoConfig.__dataclass_fields__.items() if k not in exclude}
    defaults = DemoConfig()
    overrides: dict[str, Any] = {}
    it = iter(rest)
    for flag in it:
        key = flag.lstrip("-").replace("-", "_")
        if not flag.startswith("--") or key not in fields:
            parser.error(f"unknown option {flag}; DemoConfig fields: {sorted(fields)}")
        value = next(it, None)
        if value is None:
            parser.error(f"{flag} needs a value")
        overrides[key] = _parse_field(key, getattr(defaults, key), value, parser)
    return overrides


def demo_config_file(path: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """DemoConfig fields from a JSON or YAML file (unknown fields are an error naming the file)."""
    import yaml

    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        parser.error(f"--config {path}: {err.strerror}")
    except yaml.YAMLError as err:
        parser.error(f"--config {path}: not valid YAML/JSON ({err})")
    if not isinstance(raw, dict):
        parser.error(f"--config {path}: expected a mapping of DemoConfig fields")
    unknown = sorted(set(raw) - set(DemoConfig.__dataclass_fields__))
    if unknown:
        parser.error(f"--config {path}: unknown DemoConfig field(s) {unknown}")
    return raw


def demo_config_from_cli(argv: Sequence[str] | None = None) -> DemoConfig:
    """The checked :class:`DemoConfig` of a ``reflect-trl demo`` command line: defaults, then the ``--config`` file,
    then the flags that are given."""
    parser = argparse.ArgumentParser(
        prog="reflect-trl demo",
        description=__doc__.splitlines()[0]
        + " Tiny model, data, five SFT runs, four RL variants, held-out evaluation, table and plots.",
        epilog="Any DemoConfig field can be overridden with --field value (e.g. --rl_steps 120, "
        "--eval_decodings greedy); lists take a comma-separated string or a JSON list.",
    )
    # no argparse defaults for the fields a --config file can set: a flag overrides the file only when given
    parser.add_argument("--output_dir", default=None, help="where everything goes (default: outputs/demo)")
    parser.add_argument(
        "--seed", type=int, default=None, help="seed of models, data, RL and evaluation (default: 0)"
    )
    parser.add_argument(
        "--env_name", default=None, help="environment (taxi, auto_explore, textworld, ...; default: taxi)"
    )
    parser.add_argument("--env_kwargs", default=None, help="JSON object of environment kwargs")
    parser.add_argument("--smoke", action="store_true", help="a handful of steps per stage (a minute)")
    parser.add_argument("--report_to", default=None, help="wandb (offline without an API key) or none")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "--config", default=None, help="a JSON or YAML file of DemoConfig fields (flags override it)"
    )
    parser.add_argument(
        "--evaluate_only",
        action="store_true",
        help="only the last step: evaluate the finished runs in --output_dir and write the table and summary "
        "(a configuration evaluated there before, with the same runs and settings, is reused)",
    )
    args, rest = parser.parse_known_args(argv)
    if args.no_progress:
        from reflect_trl.progress import disable_progress

        disable_progress()
    output_dir = args.output_dir or "outputs/demo"
    cfg = DemoConfig.smoke(output_dir) if args.smoke else DemoConfig(output_dir=output_dir)
    from_file = demo_config_file(args.config, parser) if args.config else {}
    cfg = replace(cfg, **from_file)
    flags = {
        name: value
        for name, value in (
            ("output_dir", args.output_dir),
            ("seed", args.seed),
            ("env_name", args.env_name),
            ("report_to", args.report_to),
        )
        if value is not None
    }
    cfg = replace(cfg, **flags)
    overrides = parse_demo_overrides(rest, parser)
    given = set(from_file) | set(overrides) | ({"env_kwargs"} if args.env_kwargs else set())
    # the environment's demo settings, for the fields neither the file nor a flag sets
    defaults = env_demo_settings(cfg.env_name, smoke=args.smoke)
    cfg = replace(cfg, **{k: v for k, v in defaults.items() if k not in given})
    if args.env_kwargs:
        cfg = replace(cfg, env_kwargs=_parse_field("env_kwargs", {}, args.env_kwargs, parser))
    cfg = replace(cfg, **overrides)
    check_demo_config(cfg)
    return cfg


def demo_cli(argv: Sequence[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = demo_config_from_cli(argv)
    return finish_pooled_demo(cfg) if "--evaluate_only" in argv else run_demo(cfg)
