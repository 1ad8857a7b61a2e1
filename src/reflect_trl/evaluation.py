"""Evaluation harness: success rates with confidence intervals, tables and readable transcripts.

One *configuration* = a policy (a model path, or the built-in ``oracle`` / ``random`` policies) with or without a
frozen reflection model. Each configuration plays ``episodes_per_stage`` seeded episodes per curriculum stage on
held-out tasks (the ``test`` split, whose seeds are disjoint from the ``train`` split), with greedy and/or sampled
decoding:

* ``greedy``: the policy takes the argmax option, the reflection model decodes greedily;
* ``sampled``: the policy samples at temperature 1 (as in training and the paper), the reflection model at
  ``reflection_temperature``.

Every configuration plays through the same lock-step :class:`~reflect_trl.rollout.RolloutEngine`: a model policy
as a :class:`~reflect_trl.rollout.PolicyActor`, the built-in policies as the scripted actors of
:mod:`reflect_trl.scripted_actors`. All configurations see the same tasks and episode seeds, and each
(configuration, stage, decoding) cell seeds the torch RNG identically, so the same seed reproduces the same table.
The option labels of a model policy are the ones recorded next to it at training time (``option_labels`` may only
repeat them).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from reflect_trl.action_head import OptionHead
from reflect_trl.config_lists import parse_list
from reflect_trl.envs import Task, make_env
from reflect_trl.progress import progress_bar
from reflect_trl.prompts import DEFAULT_LABELS, parse_option_labels, resolve_option_labels
from reflect_trl.reflection.cache import DEFAULT_REFLECTION_CACHE_SIZE, CachedReflectionPlayer
from reflect_trl.reflection.player import REFLECTION_BACKENDS, ReflectionPlayer, make_reflection_player
from reflect_trl.rollout import Actor, Episode, PolicyActor, RolloutEngine
from reflect_trl.scripted_actors import SCRIPTED_ACTORS, scripted_actor
from reflect_trl.seeding import derive_seed
from reflect_trl.validation import check_model_path

DECODINGS = ("greedy", "sampled")
SCRIPTED_POLICIES = tuple(SCRIPTED_ACTORS)


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95 % by default)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def instance_interval(rate: float, instances: int) -> tuple[float, float]:
    """95 % Wilson interval of a success rate whose episodes repeat problem instances: the effective sample size is
    the number of distinct instances (the outcomes of one instance's episodes are identical under greedy decoding on
    a deterministic environment, e.g. DangerousTaxi; conservative otherwise)."""
    return wilson_interval(rate * instances, instances)


@dataclass
class EvalConfiguration:
    name: str
    policy: str  # model path / hub id, or "oracle" / "random"
    reflection: str | None = None

    def check_models(self, served_reflection: bool = False) -> None:
        """Fail before any episode runs when a model that must be a local directory is missing or is not a model
        (:func:`reflect_trl.validation.check_model_path`). A served reflection model is a name, not a path."""
        for role, ref in (("policy", self.policy), ("reflection", self.reflection)):
            if (
                ref is None
                or (role == "reflection" and served_reflection)
                or (role == "policy" and ref in SCRIPTED_POLICIES)
            ):
                continue
            check_model_path(ref, f"configuration {self.name!r}: {role}")


@dataclass
class EvalSettings:
    env_name: str = "taxi"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    stages: list[str] | None = None  # None = all of the env's stages
    episodes_per_stage: int = 100
    decodings: list[str] = field(default_factory=lambda: list(DECODINGS))
    split: str = "test"
    seed: int = 1234
    batch_size: int = 64
    reflection_max_new_tokens: int = 64
    reflection_temperature: float = 1.0
    shuffle_options: bool = False
    device: str | None = None
    # None: each policy's recorded labels (reflect_trl.prompts.LABELS_FILE), else the defaults. A list, a
    # comma-separated string or one string of single characters; it must match what a policy recorded.
    option_labels: list[str] | str | None = None
    # "hf": reflection models run in this process; "openai": a configuration's `reflection` is the name of a model
    # served by the OpenAI-compatible server at reflection_base_url (docs/serving.md).
    reflection_backend: str = "hf"
    reflection_base_url: str | None = None
    reflection_api_key_env: str = "REFLECT_TRL_REFLECTION_API_KEY"
    reflection_concurrency: int = 32
    reflection_timeout: float = 60.0
    reflection_max_retries: int = 3
    # Greedy decoding: a memo per reflection model, shared by the configurations, stages and batches that use it,
    # generates each distinct reflection prompt once (reflect_trl.reflection.cache); 0 disables it.
    reflection_cache_size: int = DEFAULT_REFLECTION_CACHE_SIZE

    def __post_init__(self) -> None:
        if isinstance(self.env_kwargs, str):
            try:
                self.env_kwargs = json.loads(self.env_kwargs) if self.env_kwargs.strip() else {}
            except json.JSONDecodeError as err:
                raise ValueError(f"env_kwargs is not valid JSON: {self.env_kwargs!r} ({err.msg})") from None
        if not isinstance(self.env_kwargs, dict):
            raise ValueError(f"env_kwargs must be a mapping (a JSON object), got {self.env_kwargs!r}")
        self.stages = parse_list(self.stages, "stages")
        self.decodings = parse_list(self.decodings, "decodings") or []
        if not self.decodings:
            raise ValueError(f"decodings is empty; choose from {DECODINGS}")
        bad = [d for d in self.decodings if d not in DECODINGS]
        if bad:
            raise ValueError(f"unknown decoding(s) {bad}; choose from {DECODINGS}")
        if self.episodes_per_stage < 1:
            raise ValueError(f"episodes_per_stage must be >= 1, got {self.episodes_per_stage}")
        labels = parse_option_labels(self.option_labels)
        self.option_labels = list(labels) if labels is not None else None
        if self.reflection_backend not in REFLECTION_BACKENDS:
            raise ValueError(
                f"reflection_backend={self.reflection_backend!r}; choose one of {REFLECTION_BACKENDS}"
            )
        if self.reflection_cache_size < 0:
            raise ValueError(
                f"reflection_cache_size must be >= 0 (0 disables the memo), got {self.reflection_cache_size}"
            )
        if self.reflection_backend == "openai" and not self.reflection_base_url:
            raise ValueError(
                "reflection_backend='openai' needs reflection_base_url (e.g. http://127.0.0.1:8000/v1)"
            )


@dataclass
class EvalResult:
    configuration: str
    stage: str
    decoding: str
    episodes: int
    successes: int
    success_rate: float
    ci_low: float
    ci_high: float
    mean_return: float
    mean_length: float
    crash_rate: float
    seconds: float
    #: 1/0 per episode, in task order (the same tasks for every configuration: paired comparisons use it)
    outcomes: list[int] = field(default_factory=list)
    #: the problem instance of each episode (``TextEnv.instance_key``): intervals resample instances, not episodes
    instances: list[str] = field(default_factory=list)

    @classmethod
    def from_episodes(
        cls,
        name: str,
        stage: str,
        decoding: str,
        episodes: Sequence[Episode],
        seconds: float,
        instances: Sequence[str] | None = None,
    ):
        n = len(episodes)
        k = sum(ep.success for ep in episodes)
        instances = list(instances) if instances is not None else [ep.task.task_id for ep in episodes]
        lo, hi = instance_interval(k / n if n else 0.0, len(set(instances)))
        return cls(
            configuration=name,
            stage=stage,
            decoding=decoding,
            episodes=n,
            successes=k,
            success_rate=k / n if n else 0.0,
            ci_low=lo,
            ci_high=hi,
            mean_return=sum(ep.total_return for ep in episodes) / max(n, 1),
            mean_length=sum(ep.length for ep in episodes) / max(n, 1),
            crash_rate=sum(ep.crashed for ep in episodes) / max(n, 1),
            seconds=seconds,
            outcomes=[int(ep.success) for ep in episodes],
            instances=instances,
        )


def instance_keys(settings: EvalSettings, tasks: Sequence[Task]) -> list[str]:
    """``TextEnv.instance_key`` of every task (the problem instance its episode plays)."""
    env = make_env(settings.env_name, **settings.env_kwargs)
    return [env.instance_key(t) for t in tasks]


def stage_eval_tasks(
    env_name: str, env_kwargs: dict[str, Any] | None, split: str, episodes: int, seed: int, stage: str
) -> tuple[list[Task], list[int]]:
    """``episodes`` tasks of ``split`` in ``stage`` and their episode seeds: what `reflect-trl eval` plays, and what
    the RL trainer's evaluation during training plays."""
    env = make_env(env_name, **(env_kwargs or {}))
    tasks = env.make_tasks(split, episodes, seed=seed, difficulty=stage)
    seeds = [derive_seed(seed, "eval", stage, i) for i in range(len(tasks))]
    return tasks, seeds


def eval_tasks(settings: EvalSettings, stage: str) -> tuple[list[Task], list[int]]:
    """The held-out tasks and episode seeds of one stage (identical for every configuration)."""
    return stage_eval_tasks(
        settings.env_name,
        settings.env_kwargs,
        settings.split,
        settings.episodes_per_stage,
        settings.seed,
        stage,
    )


class _ModelCache:
    """Loads each model once per evaluation run."""

    def __init__(self, device: str | None) -> None:
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._models: dict[str, Any] = {}
        # greedy reflection memos by (backend, reflection model)
        self.reflection_memos: dict[tuple[str, str], CachedReflectionPlayer] = {}

    def get(self, path: str):
        if path not in self._models:
            from reflect_trl.models import load_causal_lm, load_tokenizer

            model = load_causal_lm(path, trainable=False, merge_adapter=True).to(self.device).eval()
            self._models[path] = (model, load_tokenizer(path))
        return self._models[path]


def policy_labels(settings: EvalSettings, configuration: EvalConfiguration) -> tuple[str, ...]:
    """The option labels of a configuration: ``settings.option_labels``, else those recorded next to a local
    policy, else the defaults (configured labels that differ from the recorded ones are an error)."""
    if configuration.policy in SCRIPTED_POLICIES:
        return parse_option_labels(settings.option_labels) or DEFAULT_LABELS
    local = Path(configuration.policy).expanduser()
    return resolve_option_labels(
        settings.option_labels,
        local if local.is_dir() else None,
        what=f"the policy of configuration {configuration.name!r}",
    )


def _reflection_player(
    settings: EvalSettings, configuration: EvalConfiguration, decoding: str, cache: _ModelCache
) -> ReflectionPlayer:
    """The reflection player of ``configuration`` for ``decoding`` (greedy: temperature 0), in-process or served."""
    temperature = 0.0 if decoding == "greedy" else settings.reflection_temperature
    if settings.reflection_backend == "openai":
        return make_reflection_player(
            "openai",
            max_new_tokens=settings.reflection_max_new_tokens,
            temperature=temperature,
            base_url=settings.reflection_base_url,
            model_name=configuration.reflection,
            api_key_env=settings.reflection_api_key_env,
            concurrency=settings.reflection_concurrency,
            timeout=settings.reflection_timeout,
            max_retries=settings.reflection_max_retries,
            seed=derive_seed(settings.seed, configuration.name, decoding),
        )
    r_model, r_tok = cache.get(configuration.reflection)
    return make_reflection_player(
        "hf",
        model=r_model,
        tokenizer=r_tok,
        max_new_tokens=settings.reflection_max_new_tokens,
        temperature=temperature,
    )


def run_configuration(
    settings: EvalSettings,
    configuration: EvalConfiguration,
    decoding: str,
    tasks: Sequence[Task],
    seeds: Sequence[int],
    cache: _ModelCache,
) -> list[Episode]:
    """Episodes of one configuration on ``tasks`` (batches of ``settings.batch_size``, lock-step)."""
    greedy = decoding == "greedy"
    labels = policy_labels(settings, configuration)
    actor: Actor
    if configuration.policy in SCRIPTED_POLICIES:
        actor = scripted_actor(configuration.policy, labels)
    else:
        model, tokenizer = cache.get(configuration.policy)
        actor = PolicyActor(model, tokenizer, OptionHead(tokenizer, labels), temperature=1.0, greedy=greedy)
    reflection = None
    if configuration.reflection:
        # greedy: one memo per reflection model, reused by every configuration that reads it
        memoised = greedy and settings.reflection_cache_size > 0
        key = (settings.reflection_backend, configuration.reflection)
        reflection = cache.reflection_memos.get(key) if memoised else None
        if reflection is None:
            reflection = _reflection_player(settings, configuration, decoding, cache)
            if memoised:
                reflection = cache.reflection_memos[key] = CachedReflectionPlayer(
                    reflection, settings.reflection_cache_size
                )
    engine = RolloutEngine(
        settings.env_name,
        actor,
        reflection,
        env_kwargs=settings.env_kwargs,
        shuffle_options=settings.shuffle_options,
    )
    episodes: list[Episode] = []
    for start in range(0, len(tasks), settings.batch_size):
        end = start + settings.batch_size
        episodes.extend(engine.run(tasks[start:end], seeds[start:end]))
    return episodes


def environment_card(settings: EvalSettings) -> dict[str, Any]:
    """What the results were measured on: the environment's own record (settings, engine versions) where it has
    one (TextWorld, ALFWorld: ``env.card()``), plus the reflect-trl version."""
    from reflect_trl import __version__

    env = make_env(settings.env_name, **settings.env_kwargs)
    card = (
        env.card()
        if hasattr(env, "card")
        else {"env": settings.env_name, "settings": dict(settings.env_kwargs)}
    )
    return {**card, "reflect_trl": __version__}


@dataclass
class EvalReport:
    settings: EvalSettings
    configurations: list[EvalConfiguration]
    results: list[EvalResult]
    transcripts: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False)
    #: greedy reflection memos, per reflection model: reflections asked for (``lookups``), served from the memo
    #: (``hits``) and generated (``generated``, the requests an inference server received)
    reflection_memos: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": asdict(self.settings),
            "environment": environment_card(self.settings),
            "configurations": [asdict(c) for c in self.configurations],
            "results": [asdict(r) for r in self.results],
            "reflection_memos": self.reflection_memos,
        }

    def instance_counts(self) -> list[tuple[str, int, int]]:
        """(stage, distinct instances, episodes) per stage."""
        seen: dict[str, tuple[int, int]] = {}
        for r in self.results:
            seen.setdefault(r.stage, (len(set(r.instances)) or r.episodes, r.episodes))
        return [(stage, n, m) for stage, (n, m) in seen.items()]

    def markdown(self) -> str:
        lines = [
            f"Environment `{self.settings.env_name}`, {self.settings.episodes_per_stage} held-out episodes per stage "
            f"(split `{self.settings.split}`, seed {self.settings.seed}); success rate with a 95 % Wilson interval over "
            "the distinct problem instances (a repeated instance counts once).",
            "",
        ]
        repeated = [(stage, n, m) for stage, n, m in self.instance_counts() if n < m]
        if repeated:
            lines += [
                f"Distinct instances of stage `{stage}`: {n} of {m} episodes." for stage, n, m in repeated
            ]
            lines.append("")
        lines += [
            "| configuration | decoding | stage | success (95% CI) | mean return | mean length | crash rate |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in self.results:
            lines.append(
                f"| {r.configuration} | {r.decoding} | {r.stage} | {100 * r.success_rate:.1f}% "
                f"[{100 * r.ci_low:.1f}, {100 * r.ci_high:.1f}] | {r.mean_return:.3f} | {r.mean_length:.2f} | "
                f"{100 * r.crash_rate:.1f}% |"
            )
        return "\n".join(lines) + "\n"

    def write(self, output_dir: str | Path) -> dict[str, Path]:
        out = Path(output_dir)
        (out / "transcripts").mkdir(parents=True, exist_ok=True)
        paths = {"json": out / "results.json", "markdown": out / "results.md"}
        paths["json"].write_text(json.dumps(self.to_json(), indent=2) + "\n")
        paths["markdown"].write_text(self.markdown())
        for key, records in self.transcripts.items():
            path = out / "transcripts" / f"{safe_filename(key)}.jsonl"
            with open(path, "w") as f:
                for record in records:
                    f.write(json.dumps(record) + "\n")
        return paths


def safe_filename(name: str) -> str:
    """A file name for a configuration/stage key (spaces and slashes become underscores)."""
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", name).strip("_") or "unnamed"


def read_transcripts(path: str | Path) -> list[dict[str, Any]]:
    """Load a transcripts JSONL file (errors name the file and line)."""
    records = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: invalid JSON in transcript ({err.msg})") from err
    return records


def evaluate(
    configurations: Sequence[EvalConfiguration], settings: EvalSettings, progress: bool = True
) -> EvalReport:
    """Evaluate every configuration on every stage and decoding; returns the report (not yet written)."""
    names = [c.name for c in configurations]
    if len(set(names)) != len(names):
        raise ValueError(f"configuration names must be unique, got {names}")
    for conf in configurations:
        conf.check_models(served_reflection=settings.reflection_backend == "openai")
        policy_labels(settings, conf)  # labels that disagree with a policy's fail before any episode
    stage_tasks: dict[str, tuple[list[Task], list[int]]] = {}
    if settings.stages:  # asked for by name: a stage without held-out tasks is an error
        stage_tasks = {stage: eval_tasks(settings, stage) for stage in settings.stages}
    else:  # all of the env's stages: skip (and say so) those a small corpus has no held-out tasks for
        for stage in make_env(settings.env_name, **settings.env_kwargs).stages:
            try:
                stage_tasks[stage] = eval_tasks(settings, stage)
            except (
                ValueError,
                FileNotFoundError,
            ) as err:  # FileNotFoundError: e.g. ALFWorld has no such games
                print(f"[eval] skipping stage {stage!r}: {err}", flush=True)
        if not stage_tasks:
            raise ValueError(f"{settings.env_name}: no {settings.split!r} tasks in any stage to evaluate")
    cache = _ModelCache(settings.device)
    report = EvalReport(settings, list(configurations), [])

    def decodings_of(conf: EvalConfiguration) -> list[str]:
        # Built-in policies have one decoding each: the oracle is deterministic, the random policy samples.
        return {"oracle": ["greedy"], "random": ["sampled"]}.get(conf.policy, settings.decodings)

    instances = {stage: instance_keys(settings, tasks) for stage, (tasks, _) in stage_tasks.items()}
    cells = sum(len(decodings_of(c)) for c in configurations) * len(stage_tasks)
    bar = progress_bar(total=cells, desc="eval", enabled=progress, unit="cell")
    for conf in configurations:
        for stage, (tasks, seeds) in stage_tasks.items():
            for decoding in decodings_of(conf):
                bar.set_postfix_str(f"{conf.name} / {stage} / {decoding}", refresh=True)
                torch.manual_seed(derive_seed(settings.seed, stage, decoding))
                start = time.perf_counter()
                episodes = run_configuration(settings, conf, decoding, tasks, seeds, cache)
                result = EvalResult.from_episodes(
                    conf.name, stage, decoding, episodes, time.perf_counter() - start, instances[stage]
                )
                report.results.append(result)
                report.transcripts[f"{conf.name}__{stage}__{decoding}"] = [ep.transcript() for ep in episodes]
                bar.update(1)
                if progress:
                    bar.write(
                        f"[eval] {conf.name:28s} {stage:10s} {decoding:8s} success {100 * result.success_rate:5.1f}% "
                        f"[{100 * result.ci_low:.1f}, {100 * result.ci_high:.1f}]  ({result.seconds:.1f}s)"
                    )
                    sys.stdout.flush()
    bar.close()
    report.reflection_memos = {
        reflection: {"lookups": memo.lookups, "hits": memo.hits, "generated": memo.lookups - memo.hits}
        for (_, reflection), memo in cache.reflection_memos.items()
    }
    return report


def _configurations_from(raw: Any, source: str) -> list[EvalConfiguration]:
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
        description="Evaluate policies (with or without a reflection model, or the built-in oracle/random) on "
        "held-out episodes of every stage: success with 95 % Wilson intervals, results.json, results.md and "
        "transcripts. Configurations come from --config (a 'configurations' list) and/or --policy.",
    )
    parser.add_argument(
        "--config",
        metavar="EVAL.yaml",
        help="YAML with settings (the flags below) and a 'configurations' list",
    )
    parser.add_argument(
        "--policy",
        action=_ConfigurationFlag,
        help="add one configuration: a policy directory / hub id, or oracle / random (repeatable)",
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
    from reflect_trl.validation import (
        check_env,
        check_label_tokens,
        check_reflection_server,
        load_tokenizer_checked,
    )

    check_env(settings.env_name, settings.env_kwargs, settings.stages)
    names = [c.name for c in configurations]
    if len(set(names)) != len(names):
        raise UsageError(f"configuration names must be unique, got {names}")
    served = settings.reflection_backend == "openai"
    for conf in configurations:
        conf.check_models(served_reflection=served)
        with usage_errors(f"configuration {conf.name!r}"):
            labels = policy_labels(settings, conf)
        if conf.policy not in SCRIPTED_POLICIES:
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
    report = evaluate(configurations, settings)
    paths = report.write(output_dir)
    print(report.markdown())
    print(
        f"[eval] wrote {paths['json']}, {paths['markdown']} and transcripts under {Path(output_dir) / 'transcripts'}"
    )
    return report
