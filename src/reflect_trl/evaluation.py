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
from reflect_trl.envs import Task, get_env_class, make_env
from reflect_trl.envs.base import check_evaluation_kwargs
from reflect_trl.progress import progress_bar
from reflect_trl.prompts import DEFAULT_LABELS, parse_option_labels, recommended_action, resolve_option_labels
from reflect_trl.reflection.cache import DEFAULT_REFLECTION_CACHE_SIZE, CachedReflectionPlayer
from reflect_trl.reflection.player import REFLECTION_BACKENDS, ReflectionPlayer, make_reflection_player
from reflect_trl.rollout import Actor, Episode, PolicyActor, RolloutEngine
from reflect_trl.scripted_actors import is_scripted_policy, scripted_actor, scripted_class
from reflect_trl.seeding import derive_seed
from reflect_trl.validation import check_model_path

DECODINGS = ("greedy", "sampled")


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
    policy: str  # model path / hub id, or a scripted policy (``scripted_actors``: "oracle", "oracle_random:0.5", ...)
    reflection: str | None = None

    def check_models(self, served_reflection: bool = False) -> None:
        """Fail before any episode runs when a model that must be a local directory is missing or is not a model
        (:func:`reflect_trl.validation.check_model_path`), or when a scripted policy that chooses from its reflection
        (``ScriptedActor.needs_reflection``) has no reflection model. A served reflection model is a name, not a
        path."""
        scripted = scripted_class(self.policy)
        if scripted is not None:  # a bad parameter (``oracle_random:1.5``) fails here, before any episode
            scripted_actor(self.policy)
        if scripted is not None and scripted.needs_reflection and self.reflection is None:
            raise ValueError(
                f"configuration {self.name!r}: the {self.policy} policy chooses from its reflection; "
                f"give it a reflection model (--reflection DIR after --policy {self.policy})"
            )
        for role, ref in (("policy", self.policy), ("reflection", self.reflection)):
            if (
                ref is None
                or (role == "reflection" and served_reflection)
                or (role == "policy" and is_scripted_policy(ref))
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
    # Record every turn's optimal actions (TextEnv.optimal_actions) for the reflection diagnostics of configurations
    # with a reflection model (EvalResult.diagnostics)
    reflection_diagnostics: bool = True
    # The environment's training-only kwargs (TextEnv.training_only_kwargs, e.g. AutoExplore's leaveout_prob, which
    # gives the target away) that env_kwargs may hold: any other one is refused (check_training_only_kwargs)
    allow_training_only_kwargs: list[str] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.env_kwargs, str):
            try:
                self.env_kwargs = json.loads(self.env_kwargs) if self.env_kwargs.strip() else {}
            except json.JSONDecodeError as err:
                raise ValueError(f"env_kwargs is not valid JSON: {self.env_kwargs!r} ({err.msg})") from None
        if not isinstance(self.env_kwargs, dict):
            raise ValueError(f"env_kwargs must be a mapping (a JSON object), got {self.env_kwargs!r}")
        self.stages = parse_list(self.stages, "stages")
        self.allow_training_only_kwargs = parse_list(
            self.allow_training_only_kwargs, "allow_training_only_kwargs"
        )
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

    def check_training_only_kwargs(self) -> None:
        """Refuse the environment's training-only kwargs in ``env_kwargs`` unless ``allow_training_only_kwargs``
        names them (``ValueError`` naming the kwarg, the environment and the flag that allows it)."""
        check_evaluation_kwargs(
            get_env_class(self.env_name),
            self.env_kwargs,
            self.allow_training_only_kwargs,
            setting="env_kwargs",
            how_to_allow="--allow_training_only_kwargs {name} (YAML: allow_training_only_kwargs: [{name}])",
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
    #: counts of :func:`reflection_diagnostics` (they add up over seeds)
    diagnostics: dict[str, Any] = field(default_factory=dict)

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
            diagnostics=reflection_diagnostics(episodes),
        )


def reflection_diagnostics(episodes: Sequence[Episode]) -> dict[str, Any]:
    """How the reflections steered the policy, as counts over turns (they add up over seeds). A turn's *named*
    action is the one its reflection recommends (``prompts.recommended_action``: the action text it names last); it is
    *right* when it is among the state's optimal actions (``Turn.optimal_actions``, recorded by the evaluation).

    ``named`` / ``named_right``: turns whose reflection names an action / an optimal one (the closed-loop rate at
    which the reflections name an optimal move is ``named_right / known``); ``followed``: the policy took the named
    action; ``named_wrong`` / ``deviated_from_wrong`` and ``named_right`` / ``deviated_from_right``: the mechanism check
    (a policy that learns where its reflection is wrong raises the first rate and keeps the second at 0);
    ``crashes`` by ``crash_causes`` (``info["crash_cause"]`` where the environment names one) and
    ``crashes_on_named_wrong``: crashes on a wrongly named action that the policy followed."""
    counts: dict[str, Any] = dict.fromkeys(
        ("turns", "known", "named", "named_right", "named_wrong", "followed", "deviated_from_wrong",
         "deviated_from_right", "crashes", "crashes_on_named_wrong"), 0
    )  # fmt: skip
    causes: dict[str, int] = {}
    for ep in episodes:
        for k, turn in enumerate(ep.turns):
            counts["turns"] += 1
            named = recommended_action(turn.reflection, turn.actions) if turn.reflection is not None else None
            if named is not None:
                counts["named"] += 1
                counts["followed"] += turn.action_index == named
            right = None
            if turn.optimal_actions is not None:
                counts["known"] += 1
                if named is not None:
                    right = named in turn.optimal_actions
                    counts["named_right" if right else "named_wrong"] += 1
                    if turn.action_index != named:
                        counts["deviated_from_right" if right else "deviated_from_wrong"] += 1
            if ep.crashed and k == len(ep.turns) - 1:
                counts["crashes"] += 1
                cause = str(ep.info.get("crash_cause", "unknown"))
                causes[cause] = causes.get(cause, 0) + 1
                if right is False and turn.action_index == named:
                    counts["crashes_on_named_wrong"] += 1
                    key = f"on_named_wrong:{cause}"
                    causes[key] = causes.get(key, 0) + 1
    counts["crash_causes"] = causes
    return counts


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
    if is_scripted_policy(configuration.policy):
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
    if is_scripted_policy(configuration.policy):
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
        record_optimal_actions=settings.reflection_diagnostics and reflection is not None,
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


def transcript_key(configuration: str, stage: str, decoding: str) -> str:
    """The key of one cell's transcripts in :attr:`EvalReport.transcripts` (its file: ``transcripts/<safe key>.jsonl``)."""
    return f"{configuration}__{stage}__{decoding}"


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
    settings.check_training_only_kwargs()  # before any environment is built
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
        # a scripted policy may have one decoding (the oracle is deterministic, the random policy samples)
        scripted = scripted_class(conf.policy)
        return [scripted.decoding] if scripted is not None and scripted.decoding else settings.decodings

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
                report.transcripts[transcript_key(conf.name, stage, decoding)] = [
                    ep.transcript() for ep in episodes
                ]
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
