"""Model cards of the Reflect-RL trainers (``README.md`` in the output directory and in checkpoints).

A card names the base model, the environment, the method (Reflect-RL, its SFT or RL stage, the policy or reflection
role) and its paper (and, for a third-party environment, the plugin distribution that provides it), shows how to
load and act with the model (:class:`reflect_trl.agent.ReflectAgent`, ``reflect-trl eval``), and lists the run's
final logged metrics: rollout success per curriculum stage for RL, option accuracy / reflection metrics for SFT.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reflect_trl.prompts import REFLECTION_HEADER
from reflect_trl.trainers.paper import REFLECT_RL_PAPER

#: SFT metrics reported in the card, in this order (the last logged value of each).
SFT_METRICS: tuple[str, ...] = (
    "eval_option_accuracy",
    "eval_option_nll",
    "eval_stop_rate",
    "eval_reflection_length",
    "eval_reflection_exact_match",
    "eval_reflection_names_action",
    "eval_loss",
    "train_loss",
)
#: RL metrics reported in the card besides the per-stage success (mean of the last logs of the run).
RL_METRICS: tuple[str, ...] = ("env/success_rate", "env/return", "env/episode_length", "env/crash_rate")
#: Logs averaged for an RL metric (rollout success is noisy).
RL_LAST_LOGS = 5

_ROLE_TEXT = {
    "policy": "the **policy**: it reads the state, the reflection (when it has a reflection model) and the "
    "enumerated legal actions, and answers with one option label (scored only over the offered options)",
    "reflection": "the **reflection model**: it reads the state and writes a short critique/plan that ends with "
    "`<end>`; it stays frozen while the policy is trained with RL",
}


@dataclass
class ModelCardFacts:
    """What a Reflect-RL model card says."""

    model_name: str
    stage: str  # "sft" or "rl"
    role: str  # "policy" or "reflection"
    model_dir: str  # where the model is saved (the snippets load it from there)
    base_model: str | None = None
    env_name: str | None = None
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    env_distribution: str | None = (
        None  # "name version" of the plugin distribution that provides the environment
    )
    stages: Sequence[str] = ()
    reflection_model: str | None = None  # RL: the frozen reflection model the policy played with
    option_labels: Sequence[str] | None = None
    reflection_in_prompts: bool | None = None  # SFT policy: its training prompts carried a reflection
    dataset: str | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    results: Mapping[str, float] = field(default_factory=dict)
    tags: Sequence[str] = ()


def base_model_of(model) -> str | None:
    """The ``model_name_or_path`` a (possibly PEFT-wrapped) model was loaded from."""
    config = getattr(getattr(model, "get_base_model", lambda: model)(), "config", None) or getattr(
        model, "config", None
    )
    name = getattr(config, "_name_or_path", None)
    return str(name) if name else None


def _base_line(base: str | None) -> str:
    if not base:
        return "unknown"
    path = Path(base)
    if not path.is_dir():
        return f"[`{base}`](https://huggingface.co/{base})"
    origin = ""
    metrics = path / "sft_metrics.json"
    if metrics.is_file():
        try:
            parent = json.loads(metrics.read_text()).get("model_name_or_path")
        except (json.JSONDecodeError, AttributeError):
            parent = None
        if parent:
            origin = f", the SFT warm-up of `{parent}`"
    return f"`{base}` (a local directory{origin})"


def last_values(log_history: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> dict[str, float]:
    """The last logged value of each of ``keys`` that was logged."""
    out: dict[str, float] = {}
    for entry in log_history:
        for key in keys:
            if isinstance(entry.get(key), int | float):
                out[key] = float(entry[key])
    return {k: out[k] for k in keys if k in out}


def sft_results(log_history: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The final SFT metrics (:data:`SFT_METRICS`)."""
    return last_values(log_history, SFT_METRICS)


def rl_results(log_history: Sequence[Mapping[str, Any]], last: int = RL_LAST_LOGS) -> dict[str, float]:
    """Rollout success per curriculum stage (``stage/<name>/success_rate``) and :data:`RL_METRICS`, each the mean of
    its last ``last`` logged values."""
    series: dict[str, list[float]] = {}
    for entry in log_history:
        for key, value in entry.items():
            wanted = key in RL_METRICS or (key.startswith("stage/") and key.endswith("/success_rate"))
            if wanted and isinstance(value, int | float):
                series.setdefault(key, []).append(float(value))
    order = [k for k in series if k.startswith("stage/")] + [k for k in RL_METRICS if k in series]
    return {k: sum(series[k][-last:]) / len(series[k][-last:]) for k in order}


def _results_table(facts: ModelCardFacts) -> str:
    if not facts.results:
        return "No metrics were logged (a run without evaluation or logging steps)."
    rows = []
    for key, value in facts.results.items():
        shown = (
            f"{100 * value:.1f} %"
            if key.endswith(("rate", "accuracy", "exact_match", "names_action"))
            else f"{value:.4g}"
        )
        label = f"success rate, stage `{key.split('/')[1]}`" if key.startswith("stage/") else f"`{key}`"
        rows.append(f"| {label} | {shown} |")
    if facts.stage == "rl":
        note = (
            f"Training rollouts (mean of the last {RL_LAST_LOGS} logs of each stage), not a held-out evaluation; "
            "for that run `reflect-trl eval` (below)."
        )
    else:
        note = "On the evaluation split of the SFT data (`eval_*`), as logged at the end of training."
    return "\n".join([note, "", "| metric | value |", "|---|---|", *rows])


def _policy_snippet(facts: ModelCardFacts) -> str:
    env = facts.env_name or "taxi"
    stage = facts.stages[-1] if facts.stages else None
    served = bool(facts.reflection_model and "(served at" in facts.reflection_model)
    if facts.reflection_model and not served:
        agent = f'agent = ReflectAgent.from_pretrained("{facts.model_dir}", reflection="{facts.reflection_model}")\n'
    else:
        why = (
            "it was trained with reflections: give its reflection model's directory"
            if facts.reflection_model or facts.reflection_in_prompts
            else "trained without reflections"
        )
        agent = f'agent = ReflectAgent.from_pretrained(\n    "{facts.model_dir}",\n    reflection=None,  # {why}\n)\n'
    install = (
        f"# the environment comes from the plugin distribution {facts.env_distribution.split()[0]!r}: "
        f"pip install {facts.env_distribution.split()[0]}\n"
        if facts.env_distribution
        else ""
    )
    return (
        "```python\n"
        "from reflect_trl import ReflectAgent\n"
        "from reflect_trl.envs import make_env\n\n"
        f"{agent}"
        f"{install}"
        f'env = make_env("{env}", **{dict(facts.env_kwargs)!r})\n'
        'for task in env.make_tasks("test", 4, seed=0' + (f', difficulty="{stage}"' if stage else "") + "):\n"
        "    episode = agent.play(env, task)\n"
        '    print(episode["success"], [turn["action"] for turn in episode["turns"]])\n'
        'print(episode["turns"][0])  # state, reflection, chosen action and its probability\n'
        "```\n\n"
        "`agent.act(observation)` gives the index of the action to take in one state (`env.step(...)` takes it), "
        "`agent.decide(observation)` also the reflection and every option's probability.\n"
    )


def _reflection_snippet(facts: ModelCardFacts) -> str:
    env = facts.env_name or "taxi"
    return (
        "```python\n"
        "from reflect_trl.envs import make_env\n"
        "from reflect_trl.models import load_causal_lm, load_tokenizer\n"
        "from reflect_trl.prompts import reflection_prompt\n"
        "from reflect_trl.reflection.player import make_reflection_player\n\n"
        f'reflection_dir = "{facts.model_dir}"\n'
        "reflection = make_reflection_player(\n"
        '    "hf",\n'
        "    model=load_causal_lm(reflection_dir, trainable=False, merge_adapter=True).eval(),\n"
        "    tokenizer=load_tokenizer(reflection_dir),\n"
        "    temperature=0.0,\n"
        ")\n"
        f'env = make_env("{env}", **{dict(facts.env_kwargs)!r})\n'
        'observation = env.reset(task=env.make_tasks("test", 1, seed=0)[0])\n'
        "print(reflection.generate([reflection_prompt(observation.text)]).texts[0])\n"
        "```\n"
    )


def _eval_command(facts: ModelCardFacts) -> str:
    env = facts.env_name or "taxi"
    if facts.role == "reflection":
        model = f"--policy <a policy trained with it> --reflection {facts.model_dir}"
    else:
        model = f"--policy {facts.model_dir}" + (
            f" --reflection {facts.reflection_model}" if facts.reflection_model else ""
        )
    return f"```bash\nreflect-trl eval {model} --env_name {env} --episodes_per_stage 100 --output_dir eval_{Path(facts.model_dir).name}\n```\n"


def render_model_card(facts: ModelCardFacts) -> str:
    """The card as Markdown with YAML metadata (``base_model`` only for a hub id)."""
    paper = REFLECT_RL_PAPER
    tags = list(dict.fromkeys(["reflect-trl", "reflect-rl", "trl", facts.stage, facts.role, *facts.tags]))
    if facts.env_name:
        tags.append(f"env:{facts.env_name}")
    meta = ["---", "library_name: transformers", f"model_name: {facts.model_name}"]
    if facts.base_model and not Path(facts.base_model).is_dir():
        meta.append(f"base_model: {facts.base_model}")
    meta += ["tags:", *[f"- {t}" for t in tags], "---"]
    stage = (
        "stage 1 of Reflect-RL, the supervised warm-up (`reflect-trl sft`, ReflectSFTTrainer)"
        if facts.stage == "sft"
        else "stage 2 of Reflect-RL, online RL in the environment (`reflect-trl rl`, ReflectPPOTrainer)"
    )
    lines = [
        *meta,
        "",
        f"# {facts.model_name}",
        "",
        f"A Reflect-RL {facts.role} trained with reflect-trl (Reflect-RL on [TRL](https://github.com/huggingface/trl)): "
        f"{stage}. The model is {_ROLE_TEXT.get(facts.role, facts.role)}.",
        "",
        f"- **Method:** Reflect-RL -- [{paper['title']}](https://arxiv.org/abs/{paper['id']}) (Zhou, Du, Li; ACL 2024)",
        f"- **Stage / role:** {facts.stage.upper()} / {facts.role}",
        f"- **Base model:** {_base_line(facts.base_model)}",
        f"- **Environment:** `{facts.env_name}`"
        + (f" with `{dict(facts.env_kwargs)}`" if facts.env_kwargs else "")
        + (f", curriculum stages {', '.join(f'`{s}`' for s in facts.stages)}" if facts.stages else "")
        + (
            f"; provided by the plugin distribution `{facts.env_distribution}` "
            f"(`pip install {facts.env_distribution.split()[0]}` to use this model)"
            if facts.env_distribution
            else ""
        )
        if facts.env_name
        else "- **Environment:** not recorded",
    ]
    if facts.stage == "rl":
        lines.append(
            f"- **Reflection model (frozen):** `{facts.reflection_model}`"
            if facts.reflection_model
            else "- **Reflection model:** none (the no-reflection baseline)"
        )
    if facts.dataset:
        lines.append(f"- **Training data:** `{facts.dataset}`")
    if facts.reflection_in_prompts is not None:
        lines.append(
            "- **Prompts:** with a reflection: play it together with a reflection model (`--reflection`)"
            if facts.reflection_in_prompts
            else "- **Prompts:** without a reflection (the no-reflection variant)"
        )
    if facts.option_labels:
        labels = facts.option_labels
        shown = "".join(labels) if all(len(x) == 1 for x in labels) else ", ".join(labels)
        lines.append(f"- **Option labels:** `{shown}` (recorded in `reflect_trl_labels.json`)")
    for key, value in facts.settings.items():
        lines.append(f"- `{key}`: {value}")
    lines += [
        "",
        "## Results",
        "",
        _results_table(facts),
        "",
        "## Use",
        "",
        "Held-out episodes with success rates and 95 % Wilson intervals:",
        "",
        _eval_command(facts),
        "From Python" + (" (play a few episodes):" if facts.role == "policy" else " (one reflection):"),
        "",
        _policy_snippet(facts) if facts.role == "policy" else _reflection_snippet(facts),
        "## Citation",
        "",
        "```bibtex",
        paper["citation"],
        "```",
        "",
    ]
    return "\n".join(lines)


def write_model_card(facts: ModelCardFacts, output_dir: str | Path) -> Path:
    """Write ``README.md`` (the card) into ``output_dir``."""
    path = Path(output_dir) / "README.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_model_card(facts), encoding="utf-8")
    return path


def plugin_distribution(env_name: str | None) -> str | None:
    """The distribution (``"name version"``) whose entry point provides ``env_name``; None for a built-in or an
    environment registered in the process (or when it cannot be told)."""
    if not env_name:
        return None
    from reflect_trl.envs import env_distribution

    try:
        return env_distribution(env_name)
    except Exception:  # a card never fails over this
        return None


def _tags(tags: str | Sequence[str] | None) -> list[str]:
    return [tags] if isinstance(tags, str) else list(tags or [])


def _column_values(dataset, column: str) -> list[str]:
    """The distinct values of a data set column in order of appearance ([] without that column)."""
    names = getattr(dataset, "column_names", None) or []
    return list(dict.fromkeys(str(v) for v in dataset[column])) if column in names else []


def sft_card_facts(trainer, model_name: str | None = None, dataset_name: str | None = None, tags=None):
    """The card of a ``ReflectSFTTrainer`` run (environment and stages read from the data's columns)."""
    args = trainer.args
    data = getattr(trainer, "_card_train_dataset", None)
    envs = _column_values(data, "env") if data is not None else []
    reflection_in_prompts = None
    if args.role == "policy" and data is not None and "prompt" in data.column_names and len(data):
        reflection_in_prompts = any(
            REFLECTION_HEADER in p for p in data.select(range(min(len(data), 16)))["prompt"]
        )
    return ModelCardFacts(
        model_name=model_name or Path(args.output_dir).name,
        stage="sft",
        role=args.role,
        model_dir=str(args.output_dir),
        base_model=base_model_of(trainer.model),
        env_name=envs[0] if len(envs) == 1 else (", ".join(envs) or None),
        env_distribution=plugin_distribution(envs[0]) if len(envs) == 1 else None,
        stages=_column_values(data, "difficulty") if data is not None else [],
        option_labels=tuple(args.labels) if args.role == "policy" else None,
        reflection_in_prompts=reflection_in_prompts,
        dataset=dataset_name,
        settings={
            "max_steps": args.max_steps,
            "learning_rate": args.learning_rate,
            "per_device_train_batch_size": args.per_device_train_batch_size,
        },
        results=sft_results(trainer.state.log_history),
        tags=_tags(tags),
    )


def rl_card_facts(trainer, model_name: str | None = None, tags=None):
    """The card of a ``ReflectPPOTrainer`` run."""
    args = trainer.args
    reflection = None
    if args.reflection_backend == "openai":
        served = args.reflection_server_model or args.reflection_model_name_or_path
        reflection = f"{served} (served at {args.reflection_base_url})"
    elif getattr(trainer, "reflection", None) is not None:
        player_model = getattr(trainer.reflection, "model", None)
        reflection = args.reflection_model_name_or_path or (
            base_model_of(player_model) if player_model else None
        )
        reflection = reflection or "a reflection model passed to the trainer"
    curriculum = (
        f"{args.curriculum_schedule} schedule over {list(trainer.stages)}"
        if args.curriculum
        else f"off (all of {list(trainer.stages)} mixed)"
    )
    return ModelCardFacts(
        model_name=model_name or Path(args.output_dir).name,
        stage="rl",
        role="policy",
        model_dir=str(args.output_dir),
        base_model=base_model_of(trainer.model),
        env_name=args.env_name,
        env_kwargs=dict(args.env_kwargs or {}),
        env_distribution=plugin_distribution(args.env_name),
        stages=list(trainer.stages),
        reflection_model=reflection,
        option_labels=tuple(trainer.option_head.labels),
        settings={
            "advantage_estimator": args.advantage_estimator,
            "curriculum": curriculum,
            "max_steps": args.max_steps,
            "learning_rate": args.learning_rate,
            "episodes per rollout (per process)": args.per_device_train_batch_size
            * args.steps_per_generation,
            "num_generations": args.num_generations,
        },
        results=rl_results(trainer.state.log_history),
        tags=_tags(tags),
    )


__all__ = [
    "RL_METRICS",
    "SFT_METRICS",
    "ModelCardFacts",
    "base_model_of",
    "plugin_distribution",
    "last_values",
    "render_model_card",
    "rl_card_facts",
    "rl_results",
    "sft_card_facts",
    "sft_results",
    "write_model_card",
]
