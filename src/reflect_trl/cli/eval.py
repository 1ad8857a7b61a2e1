"""``reflect-trl eval``: the command line of :mod:`reflect_trl.evaluation` (YAML + flags, up-front checks)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reflect_trl.reflection.base import REFLECTION_BACKENDS

if TYPE_CHECKING:  # imported where they are used: --help stays free of torch
    from reflect_trl.evaluation import EvalConfiguration, EvalReport, EvalSettings


def _configurations_from(raw: Any, source: str) -> list[EvalConfiguration]:
    from reflect_trl.evaluation import EvalConfiguration

    if not isinstance(raw, list):
        raise ValueError(
            f"{source}: 'configurations' must be a list of {{name, policy, reflection}} mappings"
        )
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or "policy" not in item:
            raise ValueError(f"{source}: configurations[{i}] needs a 'policy' field, got {item!r}")
        unknown = set(item) - {"name", "policy", "reflection"}
        if unknown:
            raise ValueError(f"{source}: configurations[{i}] has unknown field(s) {sorted(unknown)}")
        out.append(
            EvalConfiguration(
                str(item.get("name") or item["policy"]), str(item["policy"]), item.get("reflection")
            )
        )
    return out


#: Help of the ``reflect-trl eval`` flags that set an :class:`EvalSettings` field (the YAML key of the same name).
SETTING_HELP: dict[str, str] = {
    "env_name": "registered environment (default: taxi)",
    "env_kwargs": "environment kwargs, a JSON object (e.g. '{\"horizon\": 15}')",
    "allow_training_only_kwargs": "training-only environment kwargs (e.g. auto_explore's leaveout_prob, which gives "
    "the target away) that env_kwargs may hold anyway: comma-separated or a JSON list (default: none, refused)",
    "split": "task split played (default: test, held out from training)",
    "stages": "stages to evaluate: comma-separated or a JSON list (default: all of the environment's)",
    "decodings": "greedy, sampled or both: comma-separated or a JSON list (default: greedy,sampled)",
    "episodes_per_stage": "episodes per stage and configuration (default: 100)",
    "seed": "seed of the tasks, episodes and sampling (default: 1234)",
    "batch_size": "episodes played in lock-step (default: 64)",
    "device": "cpu, cuda, cuda:1, ... (default: cuda when available)",
    "option_labels": "option labels; default: those recorded with each policy (must match them)",
    "reflection_max_new_tokens": "token budget of one reflection (default: 64)",
    "reflection_temperature": "reflection temperature of sampled decoding (default: 1.0; greedy decodes greedily)",
    "reflection_backend": "hf: reflection models run here (default); openai: 'reflection' names a served model",
    "reflection_base_url": "openai backend: the server's base URL, e.g. http://127.0.0.1:8000/v1",
    "reflection_api_key_env": "openai backend: environment variable holding the API key",
    "reflection_concurrency": "openai backend: requests in flight (default: 32)",
    "reflection_timeout": "openai backend: seconds per request (default: 60)",
    "reflection_max_retries": "openai backend: retries of a failed request (default: 3)",
}


_INT_SETTINGS = (
    "episodes_per_stage",
    "seed",
    "batch_size",
    "reflection_max_new_tokens",
    "reflection_concurrency",
    "reflection_max_retries",
)


_FLOAT_SETTINGS = ("reflection_temperature", "reflection_timeout")


def eval_parser() -> argparse.ArgumentParser:
    """The command line of ``reflect-trl eval``."""
    parser = argparse.ArgumentParser(
        prog="reflect-trl eval",
        usage="reflect-trl eval [--config EVAL.yaml] [--policy DIR [--reflection DIR] [--name NAME] ...] "
        "[--SETTING VALUE ...]",
        description="Evaluate policies (with or without a reflection model, or the built-in oracle / random / "
        "oracle_random / reflection_follower) on held-out episodes of every stage: success with 95 % Wilson "
        "intervals, results.json, results.md and transcripts. Configurations come from --config (a "
        "'configurations' list) and/or --policy.",
    )
    parser.add_argument(
        "--config",
        metavar="EVAL.yaml",
        help="YAML with settings (the flags below) and a 'configurations' list",
    )
    parser.add_argument(
        "--policy",
        action=_ConfigurationFlag,
        help="add one configuration: a policy directory / hub id, or oracle / random / oracle_random (the "
        "authors' 'oracle + random 0.9'; oracle_random:0.5 for another probability) / reflection_follower (takes the "
        "move its --reflection names) (repeatable)",
    )
    parser.add_argument(
        "--reflection",
        action=_ConfigurationFlag,
        help="the reflection model of the configuration of the --policy before it (default: none)",
    )
    parser.add_argument(
        "--name",
        action=_ConfigurationFlag,
        help="the name of the configuration of the --policy before it (default: the policy's directory name)",
    )
    parser.add_argument("--output_dir", default=None, help="where results go (default: outputs/eval)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    for name, help_ in SETTING_HELP.items():
        kwargs: dict[str, Any] = {"default": None, "help": help_}
        if name in _INT_SETTINGS:
            kwargs["type"] = int
        elif name in _FLOAT_SETTINGS:
            kwargs["type"] = float
        elif name == "reflection_backend":
            kwargs["choices"] = REFLECTION_BACKENDS
        parser.add_argument(f"--{name}", **kwargs)
    return parser


class _ConfigurationFlag(argparse.Action):
    """``--policy`` opens a configuration; ``--reflection`` / ``--name`` complete the last one opened, so
    ``--policy A --reflection R --name a --policy B`` gives two configurations (nothing is silently replaced)."""

    def __call__(self, parser, namespace, values, option_string=None):
        configs = getattr(namespace, "cli_configurations", None) or []
        if self.dest == "policy":
            configs.append({"policy": values})
        elif not configs:
            parser.error(
                f"{option_string} {values!r} comes before any --policy: it belongs to the --policy before it"
            )
        elif self.dest in configs[-1]:
            parser.error(
                f"{option_string} given twice for --policy {configs[-1]['policy']!r} "
                f"({configs[-1][self.dest]!r}, then {values!r})"
            )
        else:
            configs[-1][self.dest] = values
        namespace.cli_configurations = configs


def read_eval_yaml(path: str) -> dict[str, Any]:
    """An eval YAML file as a mapping (a missing file, invalid YAML or a non-mapping is a usage error)."""
    import yaml

    from reflect_trl.errors import MissingPathError, UsageError

    file = Path(path).expanduser()
    if not file.is_file():
        raise MissingPathError(
            f"--config {path!r} does not exist (an eval YAML file, e.g. recipes/taxi/cpu/eval.yaml)"
        )
    try:
        raw = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise UsageError(f"{path}{where}: invalid YAML ({getattr(err, 'problem', None) or err})") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: the YAML must be a mapping of settings and a 'configurations' list")
    return raw


def parse_eval_args(
    argv: Sequence[str] | None = None,
) -> tuple[list[EvalConfiguration], EvalSettings, str]:
    """(configurations, settings, output_dir) of an ``eval`` command line: the ``--config`` YAML, overridden by
    the flags. Unknown YAML keys and an empty list of configurations are errors (``SystemExit``, as argparse)."""
    from reflect_trl.errors import usage_errors

    parser = eval_parser()
    args = parser.parse_args(argv)
    from reflect_trl.evaluation import EvalConfiguration, EvalSettings  # after --help: it imports torch

    if args.no_progress:
        from reflect_trl.progress import disable_progress

        disable_progress()
    raw: dict[str, Any] = read_eval_yaml(args.config) if args.config else {}
    source = args.config or "command line"
    with usage_errors():
        configurations = _configurations_from(raw.pop("configurations", []), source)
    output_dir = args.output_dir or raw.pop("output_dir", "outputs/eval")
    raw.pop("output_dir", None)
    for key in SETTING_HELP:
        if getattr(args, key) is not None:
            raw[key] = getattr(args, key)
    for flags in getattr(args, "cli_configurations", None) or []:
        configurations.append(
            EvalConfiguration(
                flags.get("name") or Path(flags["policy"]).name, flags["policy"], flags.get("reflection")
            )
        )
    if not configurations:
        parser.error("nothing to evaluate: give --policy or a 'configurations' list in --config")
    known = set(EvalSettings.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        parser.error(f"{source}: unknown setting(s) {unknown}; known: {sorted(known)}")
    try:
        settings = EvalSettings(**raw)
    except (ValueError, TypeError) as err:
        parser.error(f"{source}: {err}")
    return configurations, settings, str(output_dir)


def check_eval_inputs(configurations: Sequence[EvalConfiguration], settings: EvalSettings) -> None:
    """Up-front checks of ``reflect-trl eval`` (before any model is loaded or file written): the environment, its
    kwargs and stages, unique names, every model path, the option labels against each policy's tokenizer and the
    reflection server settings. Raises :class:`~reflect_trl.errors.UsageError`."""
    from reflect_trl.errors import UsageError, usage_errors
    from reflect_trl.evaluation import policy_labels
    from reflect_trl.models import load_tokenizer_checked
    from reflect_trl.scripted_actors import is_scripted_policy
    from reflect_trl.validation import (
        check_env,
        check_label_tokens,
        check_reflection_server,
    )

    check_env(settings.env_name, settings.env_kwargs, settings.stages)
    with usage_errors():
        settings.check_training_only_kwargs()
    names = [c.name for c in configurations]
    if len(set(names)) != len(names):
        raise UsageError(f"configuration names must be unique, got {names}")
    served = settings.reflection_backend == "openai"
    for conf in configurations:
        conf.check_models(served_reflection=served)
        with usage_errors(f"configuration {conf.name!r}"):
            labels = policy_labels(settings, conf)
        if not is_scripted_policy(conf.policy):
            tokenizer = load_tokenizer_checked(conf.policy, f"configuration {conf.name!r}: policy")
            check_label_tokens(tokenizer, labels, f"configuration {conf.name!r}: option labels")
        if served and conf.reflection:
            check_reflection_server(
                base_url=settings.reflection_base_url,
                model_name=conf.reflection,
                max_new_tokens=settings.reflection_max_new_tokens,
                concurrency=settings.reflection_concurrency,
                timeout=settings.reflection_timeout,
                max_retries=settings.reflection_max_retries,
                api_key_env=settings.reflection_api_key_env,
            )


def eval_cli(argv: Sequence[str] | None = None) -> EvalReport:
    """``reflect-trl eval --config eval.yaml`` or ``--policy DIR [--reflection DIR]`` (flags override the YAML)."""
    configurations, settings, output_dir = parse_eval_args(argv)
    check_eval_inputs(configurations, settings)
    from reflect_trl.evaluation import evaluate

    report = evaluate(configurations, settings)
    paths = report.write(output_dir)
    print(report.markdown())
    print(
        f"[eval] wrote {paths['json']}, {paths['markdown']} and transcripts under {Path(output_dir) / 'transcripts'}"
    )
    return report
