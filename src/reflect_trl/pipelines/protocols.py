"""What a demo run trains and evaluates: the protocols, the configurations (table rows) and their job graph.

A **protocol** fixes how the data is made and how the players decode:

* ``strict`` -- this project's: the policy is SFT'd on the oracle's actions, reading the SFT'd reflection model's own
  reflections (``reflect-trl relabel``); in RL the reflection model decodes greedily; both decodings are evaluated.
* ``paper`` -- the authors' DangerousTaxi protocol: SFT data from "oracle + random 0.9" trajectories with the policy
  target the *executed* (mostly random) action and reflections naming the oracle's move; both players sample at
  T = 1 in RL (and the ``sampled`` evaluation is the authors' own; ``greedy`` is reported beside it).

A **configuration** is one row of the results table: a policy run with (or without) a reflection run. A demo trains
only the runs its configurations need (``DemoConfig.configurations``; default: the protocol's own), so an experiment
is a set of configurations, not a script.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reflect_trl.pipelines.jobs import Job
from reflect_trl.scripted_actors import OracleRandomActor, is_scripted_policy

if TYPE_CHECKING:
    from reflect_trl.data.builder import DataBuilderConfig
    from reflect_trl.pipelines.demo import DemoConfig


#: the option-lookup warm-up's steps where an environment's option list changes (50-63 % option accuracy on
#: DangerousTaxi's shuffled and TextWorld's rows; docs/studies/2026-12-07_textworld_settings.md)
LOOKUP_WARM_UP_STEPS = 8000

# The demo's settings per environment (DemoConfig fields), used where the command line and the --config file leave a
# field unset; a smoke run takes only those that are no budget (env_kwargs, configurations).
ENV_DEMO_SETTINGS: dict[str, dict[str, Any]] = {
    # the pinned package corpus (held-out repositories, docs/auto_explore_corpus.md), file views kept small for the
    # tiny models' context, and the option-lookup warm-up (a folder's entries change with the state); half
    # TextWorld's warm-up, whose rows are shorter, to fit one seed in 40 min on a 2-core CPU
    "auto_explore": {
        "env_kwargs": {"corpus": "packages", "horizon": 15, "max_content_tokens": 48, "max_content_lines": 8},
        "sft_lookup_steps": LOOKUP_WARM_UP_STEPS // 2,
        "sft_policy_steps": 1000,
        "configurations": ["sft_only", "reflect_sft", "reflect_rl", "oracle", "random"],
        "rl_steps": 100,
        "eval_episodes_per_stage": 100,
    },
    # games a random policy does not solve (longer quests, more rooms and objects, a horizon of 2.5-5x the oracle's
    # 2-4 commands), and the option-lookup warm-up, without which the tiny policies do not read TextWorld's changing
    # command list (docs/studies/2026-12-07_textworld_settings.md)
    "textworld": {
        "env_kwargs": {
            "horizon": 10,
            "settings": {
                "easy": {"world_size": 2, "nb_objects": 4, "quest_length": 2},
                "medium": {"world_size": 3, "nb_objects": 6, "quest_length": 3},
                "hard": {"world_size": 4, "nb_objects": 8, "quest_length": 4},
            },
        },
        "sft_lookup_steps": LOOKUP_WARM_UP_STEPS,
        "sft_policy_steps": 1000,
        "configurations": ["sft_only", "reflect_sft", "reflect_rl", "oracle", "random"],
        # one seed within 30 min on a 2-core CPU: RL at about 2 s a step, and every evaluation game generated once
        "rl_steps": 100,
        "eval_episodes_per_stage": 100,
    },
}
#: the fields of ENV_DEMO_SETTINGS a smoke run keeps
SMOKE_KEEPS = ("env_kwargs", "configurations")


def env_demo_settings(env_name: str, smoke: bool = False) -> dict[str, Any]:
    """The demo's own settings for ``env_name`` (:data:`ENV_DEMO_SETTINGS`; ``smoke``: no budgets), a fresh copy."""
    settings = copy.deepcopy(ENV_DEMO_SETTINGS.get(env_name, {}))
    return {k: v for k, v in settings.items() if k in SMOKE_KEEPS} if smoke else settings


# RL-only environment kwargs. DangerousTaxi's -1 raw step cost makes an early crash cheaper than a late one, so a
# policy that rarely succeeds learns to crash fast (docs/experiments.md); the demo's RL drops the step cost.
# (AutoExplore's step_cost=0 removes the same incentive there, but with the tiny models it measured worse and 4x
# slower than the cost table, docs/experiments.md §7, so the demo keeps the table.)
RL_ENV_KWARGS: dict[str, dict[str, Any]] = {"taxi": {"step_reward": 0.0}}


@dataclass(frozen=True)
class Protocol:
    configurations: tuple[str, ...]
    relabel: bool  # the policy's SFT data reads the SFT'd reflection model's own reflections
    rl_reflection_temperature: float
    rl_steps: int  # the RL runs' optimizer steps unless DemoConfig.rl_steps is given
    data: dict[str, Any] = field(default_factory=dict)  # DataBuilderConfig fields


PROTOCOLS: dict[str, Protocol] = {
    "strict": Protocol(
        ("sft_only", "rl_plain", "reflect_sft", "reflect_rl", "no_negatives", "no_curriculum"),
        relabel=True,
        rl_reflection_temperature=0.0,
        rl_steps=300,
    ),
    "paper": Protocol(
        ("sft_only", "rl_plain", "reflect_sft", "reflect_rl", "data_behaviour", "reflection_follower"),
        relabel=False,
        rl_reflection_temperature=1.0,
        # 900, not 300: pooled validation `pickup` success 7.7 against 2.5 % over seeds 0-2 (docs/experiments.md §1.4g)
        rl_steps=900,
        data={"random_action_prob": 0.9, "policy_targets": "executed"},
    ),
}


@dataclass(frozen=True)
class Configuration:
    label: str  # the row of the results table
    policy: str  # the run whose model is the policy, or a scripted policy (scripted_actors.SCRIPTED_ACTORS)
    reflection: str | None = (
        None  # the run whose model is the reflection player (``<rl run>/reflection``: trained)
    )

    @property
    def runs(self) -> tuple[str, ...]:
        """The trained runs the row reads (a scripted policy is none)."""
        return tuple(run for run in (self.policy, self.reflection) if run and not is_scripted_policy(run))

    @property
    def jobs(self) -> tuple[str, ...]:
        """The training jobs that write those runs (``rl_both/reflection`` is written by the job ``rl_both``)."""
        return tuple(dict.fromkeys(run.split("/")[0] for run in self.runs))

    def policy_path(self, runs: Path) -> str:
        """What evaluation loads as the policy: the run's folder under ``runs``, or the scripted policy's name."""
        return self.policy if is_scripted_policy(self.policy) else str(runs / self.policy)


CONFIGURATIONS: dict[str, Configuration] = {
    "sft_only": Configuration("SFT only", "sft_plain"),
    "rl_plain": Configuration("SFT + RL w/o reflection", "rl_plain"),
    "reflect_sft": Configuration("Reflect SFT (before RL)", "sft_policy", "sft_reflection"),
    "reflect_rl": Configuration("Reflect-RL", "rl_reflect", "sft_reflection"),
    "no_negatives": Configuration(
        "Reflect-RL w/o negative examples", "rl_reflect_no_negatives", "sft_reflection_positive"
    ),
    "no_curriculum": Configuration("Reflect-RL w/o curriculum", "rl_reflect_no_curriculum", "sft_reflection"),
    # the SFT start of no_negatives: the negative examples' effect without RL (docs/experiments.md §1.4f)
    "reflect_sft_no_negatives": Configuration(
        "Reflect SFT w/o negative examples", "sft_policy_positive", "sft_reflection_positive"
    ),
    # design D1 (docs/experiments.md): reflections sampled at T = 1 during RL, the frozen player
    "sampled_reflections": Configuration(
        "Reflect-RL, reflections sampled in RL", "rl_reflect_sampled", "sft_reflection"
    ),
    # both players learn / only the reflection player learns (ReflectPPOConfig.train_reflection)
    "both_learn": Configuration("Reflect-RL, both players learn", "rl_both", "rl_both/reflection"),
    "reflection_learns": Configuration(
        "Reflect-RL, only the reflection learns", "sft_policy", "rl_reflection_only/reflection"
    ),
    # the reflection player's own reward (ReflectPPOConfig.reflection_reward): does the move it names check out
    # against the environment's oracle? verified alone, or mixed with the policy's advantage
    "both_learn_verified": Configuration(
        "Reflect-RL, both learn (verified reward)", "rl_both_verified", "rl_both_verified/reflection"
    ),
    "both_learn_mixed": Configuration(
        "Reflect-RL, both learn (mixed reward)", "rl_both_mixed", "rl_both_mixed/reflection"
    ),
    "reflection_learns_verified": Configuration(
        "Reflect-RL, only the reflection learns (verified reward)",
        "sft_policy",
        "rl_reflection_only_verified/reflection",
    ),
    # its two controls, with the same policy (the Reflect SFT one): on-policy supervision towards the oracle
    # reflector's text at the states the pair visits (DAgger), and the reflection SFT continued on the oracle's
    # trajectories with as many labelled states as the verified reflection consumed
    "reflection_dagger": Configuration(
        "Reflection: on-policy oracle SFT (control)", "sft_policy", "rl_reflection_dagger/reflection"
    ),
    "reflection_label_matched": Configuration(
        "Reflection: SFT continued, label-matched (control)", "sft_policy", "sft_reflection_label_matched"
    ),
    # the scripted reference rows (no training): the environment's oracle (greedy) and a uniformly random legal
    # action (sampled), on the same evaluation episodes
    "oracle": Configuration("oracle", "oracle"),
    "random": Configuration("random policy", "random"),
    # design D3: the SFT policy trained on for as many optimizer steps as RL takes (compute-matched control)
    "continued_sft": Configuration("Reflect SFT, continued", "sft_policy_continued", "sft_reflection"),
    # the behaviour that generated the data ("oracle + random p": the protocol's p, or the demo's random_action_prob;
    # configuration_rows gives it the demo's p): what a policy that fits executed-action SFT targets exactly can
    # reach (docs/experiments.md §1.4g). No training.
    "data_behaviour": Configuration("oracle + random (the data's behaviour, no training)", "oracle_random"),
    # a policy that always takes the move its SFT'd reflection names: the ceiling of an RL that only sharpens copying
    # the reflection (docs/experiments.md §1.4h). No training of the policy.
    "reflection_follower": Configuration(
        "follows its reflection (no policy training)", "reflection_follower", "sft_reflection"
    ),
}

# SFT run -> (data set, role, reflection run whose own reflections replace the oracle's in the policy data)
SFT_RUNS: dict[str, tuple[str, str, str | None]] = {
    "sft_reflection": ("reflection", "reflection", None),
    "sft_reflection_positive": ("reflection_positive", "reflection", None),
    "sft_policy": ("policy_reflect", "policy", "sft_reflection"),
    "sft_policy_positive": ("policy_reflect_positive", "policy", "sft_reflection_positive"),
    "sft_plain": ("policy_plain", "policy", None),
    "sft_policy_continued": ("policy_reflect", "policy", "sft_reflection"),
    # the reflection SFT continued on the oracle's trajectories, for as many rows as rl_reflection_only_verified's
    # oracle-labelled turns (reflect-trl sft --match_oracle_labels_of)
    "sft_reflection_label_matched": ("reflection", "reflection", None),
    # the option-lookup warm-up (DemoConfig.sft_lookup_steps) every other policy SFT run starts from: reflection +
    # shuffled options, no state (reflect-trl lookup-data)
    "sft_policy_lookup": ("policy_lookup", "policy", None),
}

#: the policy SFT runs that start from the option-lookup warm-up when the demo has one
LOOKUP_STARTED = ("sft_policy", "sft_policy_positive", "sft_plain")

#: the RL run whose oracle-labelled reflection turns the label-matched control matches
LABEL_MATCHED_TO = "rl_reflection_only_verified"


@dataclass(frozen=True)
class RLRun:
    policy: str  # the SFT run it starts from
    reflection: str | None
    curriculum: bool = True
    sampled_reflections: bool = False  # reflections at T = 1 whatever the protocol
    train_reflection: bool = False
    train_policy: bool = True
    reflection_reward: str = "advantage"  # ReflectPPOConfig.reflection_reward (train_reflection)
    reflection_objective: str = "rl"  # ReflectPPOConfig.reflection_objective (train_reflection)


RL_RUNS: dict[str, RLRun] = {
    "rl_plain": RLRun("sft_plain", None),
    "rl_reflect": RLRun("sft_policy", "sft_reflection"),
    "rl_reflect_no_negatives": RLRun("sft_policy_positive", "sft_reflection_positive"),
    "rl_reflect_no_curriculum": RLRun("sft_policy", "sft_reflection", curriculum=False),
    "rl_reflect_sampled": RLRun("sft_policy", "sft_reflection", sampled_reflections=True),
    "rl_both": RLRun("sft_policy", "sft_reflection", sampled_reflections=True, train_reflection=True),
    "rl_reflection_only": RLRun(
        "sft_policy", "sft_reflection", sampled_reflections=True, train_reflection=True, train_policy=False
    ),
    "rl_both_verified": RLRun(
        "sft_policy",
        "sft_reflection",
        sampled_reflections=True,
        train_reflection=True,
        reflection_reward="verified",
    ),
    "rl_both_mixed": RLRun(
        "sft_policy",
        "sft_reflection",
        sampled_reflections=True,
        train_reflection=True,
        reflection_reward="mixed",
    ),
    "rl_reflection_only_verified": RLRun(
        "sft_policy",
        "sft_reflection",
        sampled_reflections=True,
        train_reflection=True,
        train_policy=False,
        reflection_reward="verified",
    ),
    "rl_reflection_dagger": RLRun(
        "sft_policy",
        "sft_reflection",
        sampled_reflections=True,
        train_reflection=True,
        train_policy=False,
        reflection_objective="oracle_sft",
    ),
}


def configurations_of(cfg: DemoConfig) -> list[str]:
    """The configurations a demo run trains and evaluates (its own list, else its protocol's)."""
    return list(cfg.configurations or PROTOCOLS[cfg.protocol].configurations)


def configuration_rows(cfg: DemoConfig) -> list[Configuration]:
    """The demo's configurations (:func:`configurations_of`) as table rows. ``data_behaviour`` plays what the demo's
    policy SFT targets teach: "oracle + random p" with the data's p for executed-action targets, the oracle
    (p = 0) for oracle targets."""
    rows = []
    for name in configurations_of(cfg):
        row = CONFIGURATIONS[name]
        if name == "data_behaviour":
            data = data_builder_config(cfg, cfg.output_dir)
            p = data.random_action_prob if data.policy_targets == "executed" else 0.0
            row = replace(row, policy=f"{OracleRandomActor.name}:{p:g}")
        rows.append(row)
    return rows


def rl_steps_of(cfg: DemoConfig) -> int:
    """The optimizer steps of the demo's RL runs (its ``rl_steps``, else its protocol's)."""
    return cfg.rl_steps if cfg.rl_steps is not None else PROTOCOLS[cfg.protocol].rl_steps


def rl_stages_of(cfg: DemoConfig) -> list[str]:
    """The curriculum stages the demo's RL runs train on (its ``rl_stages``, else every stage of the environment)."""
    from reflect_trl.envs import get_env_class

    return list(cfg.rl_stages or get_env_class(cfg.env_name).stages)


def needed_runs(cfg: DemoConfig) -> list[str]:
    """Every SFT and RL run the configurations need, dependencies first."""
    runs: dict[str, None] = {}

    def add(run: str) -> None:
        run = run.split("/")[0]
        if run in RL_RUNS:
            add(RL_RUNS[run].policy)
            if RL_RUNS[run].reflection:
                add(RL_RUNS[run].reflection)
        elif run in SFT_RUNS and SFT_RUNS[run][2] and PROTOCOLS[cfg.protocol].relabel:
            add(SFT_RUNS[run][2])
        if run == "sft_policy_continued":
            add("sft_policy")
        if run in LOOKUP_STARTED and cfg.sft_lookup_steps > 0:
            add("sft_policy_lookup")
        if run == "sft_reflection_label_matched":
            add("sft_reflection")
            add(LABEL_MATCHED_TO)
        runs[run] = None

    for row in configuration_rows(cfg):
        for job in row.jobs:
            add(job)
    return list(runs)


def data_settings(cfg: DemoConfig) -> dict[str, Any]:
    """The protocol's data settings (``DataBuilderConfig`` fields), with the demo's ``random_action_prob`` if given."""
    settings = dict(PROTOCOLS[cfg.protocol].data)
    if cfg.random_action_prob is not None:
        settings["random_action_prob"] = cfg.random_action_prob
    return settings


def data_builder_config(cfg: DemoConfig, output_dir: str | Path) -> DataBuilderConfig:
    """The SFT data's builder settings: the demo's counts and seed with the protocol's :func:`data_settings`."""
    from reflect_trl.data.builder import DataBuilderConfig

    return DataBuilderConfig(
        env_name=cfg.env_name,
        env_kwargs=dict(cfg.env_kwargs),
        n_train_tasks=cfg.n_train_tasks,
        n_val_tasks=cfg.n_val_tasks,
        negative_prob=cfg.negative_prob,
        seed=cfg.seed,
        output_dir=str(output_dir),
        **data_settings(cfg),
    )


def check_data_settings(cfg: DemoConfig) -> None:
    """Refuse data settings the builder would refuse."""
    from reflect_trl.errors import UsageError

    try:
        data_builder_config(cfg, cfg.output_dir)  # builds the settings only, writes nothing
    except ValueError as err:
        raise UsageError(str(err)) from None


def relabelled(cfg: DemoConfig, sft_run: str) -> bool:
    """Whether the policy SFT run ``sft_run`` learns on its reflection model's own reflections (reflect-trl relabel)."""
    _, role, reflector = SFT_RUNS[sft_run]
    return role == "policy" and reflector is not None and PROTOCOLS[cfg.protocol].relabel


def sft_dataset(cfg: DemoConfig, sft_run: str, data: Path) -> Path:
    """The data set the SFT run ``sft_run`` trains on (the relabelled copy where :func:`relabelled`)."""
    dataset = SFT_RUNS[sft_run][0]
    return data / (f"{dataset}_model" if relabelled(cfg, sft_run) else dataset)


def sft_learning_rate(cfg: DemoConfig, sft_run: str) -> float:
    """``sft_policy_learning_rate`` for a policy run (when set), else ``sft_learning_rate``."""
    if SFT_RUNS[sft_run][1] == "policy" and cfg.sft_policy_learning_rate is not None:
        return cfg.sft_policy_learning_rate
    return cfg.sft_learning_rate


def flags(**values: Any) -> list[str]:
    """``--key value`` pairs for a CLI argv (booleans as true/false)."""
    argv: list[str] = []
    for key, value in values.items():
        argv += [f"--{key}", ("true" if value else "false") if isinstance(value, bool) else str(value)]
    return argv


def _train_args(cfg: DemoConfig, run_dir: Path) -> list[str]:
    run_dir.mkdir(parents=True, exist_ok=True)
    return flags(
        output_dir=run_dir,
        use_cpu=True,
        bf16=False,
        seed=cfg.seed,
        report_to=cfg.report_to,
        run_name=run_dir.name,
        save_strategy="no",
        disable_tqdm=True,
    )


def demo_jobs(
    cfg: DemoConfig, base: Path, data: Path, runs: Path, reflection_base_url: str | None = None
) -> list[Job]:
    """The SFT, relabel and RL jobs of the configurations (long chains first), every SFT run starting from ``base``
    (the continued SFT from ``sft_policy``); with ``reflection_base_url`` the RL steps request their reflections from
    that server."""
    protocol = PROTOCOLS[cfg.protocol]
    rl_steps = rl_steps_of(cfg)
    jobs: dict[str, Job] = {}
    wanted = needed_runs(cfg)

    def add(
        name: str, command: str, argv: list[str], needs: tuple[str, ...], output: Path, run_dir: bool = True
    ):
        env = {"WANDB_DIR": str(output.resolve())} if run_dir else {}
        jobs[name] = Job(name, command, argv, needs, env, output=output)

    def sft(name: str) -> None:
        dataset, role, reflector = SFT_RUNS[name]
        steps = cfg.sft_reflection_steps if role == "reflection" else cfg.sft_policy_steps
        needs: tuple[str, ...] = ()
        if relabelled(cfg, name) and f"relabel_{dataset}" not in jobs:
            add(
                f"relabel_{dataset}",
                "relabel",
                flags(
                    dataset=data / f"{dataset}.jsonl",
                    reflection_model=runs / reflector,
                    output=sft_dataset(cfg, name, data),
                    max_new_tokens=cfg.rl_reflection_max_new_tokens,
                    seed=cfg.seed,
                )
                + ["--replace"],
                (reflector,),
                sft_dataset(cfg, name, data),
                run_dir=False,
            )
        if relabelled(cfg, name):
            needs = (f"relabel_{dataset}",)
        if name == "sft_policy_lookup":  # the warm-up's rows come from the oracle-reflection policy data
            steps = cfg.sft_lookup_steps
            add(
                "lookup_data",
                "lookup-data",
                flags(
                    dataset=data / "policy_reflect.jsonl",
                    output=sft_dataset(cfg, name, data),
                    seed=cfg.seed,
                ),
                (),
                sft_dataset(cfg, name, data),
                run_dir=False,
            )
            needs = ("lookup_data",)
        start, schedule = base, dict(lr_scheduler_type="cosine", warmup_steps=max(1, steps // 20))
        if name in LOOKUP_STARTED and cfg.sft_lookup_steps > 0:
            start, needs = runs / "sft_policy_lookup", needs + ("sft_policy_lookup",)
        if name == "sft_policy_continued":  # the Reflect SFT policy, trained on for rl_steps more steps
            start, steps, schedule = runs / "sft_policy", rl_steps, dict(lr_scheduler_type="constant")
            needs += ("sft_policy",)
        matched: list[str] = []
        learning_rate = sft_learning_rate(cfg, name)
        if name == "sft_reflection_label_matched":  # the reflection SFT, on for the verified run's labels
            start, schedule = runs / "sft_reflection", dict(lr_scheduler_type="constant")
            needs += ("sft_reflection", LABEL_MATCHED_TO)
            # the steps come from the run it matches (max_steps below is replaced); the rate is the one the
            # reflection player learns with in RL
            matched = flags(match_oracle_labels_of=runs / LABEL_MATCHED_TO)
            learning_rate = cfg.rl_reflection_learning_rate
        argv = flags(
            model_name_or_path=start,
            dataset_path=sft_dataset(cfg, name, data),
            env_name=cfg.env_name,
            role=role,
            max_steps=steps,
            per_device_train_batch_size=cfg.sft_batch_size,
            learning_rate=learning_rate,
            **schedule,
            logging_steps=max(1, steps // 10),
            eval_strategy="no",
            max_length=1024,
            max_eval_samples=cfg.sft_eval_samples,
            eval_num_policy_samples=cfg.sft_eval_samples,
            eval_num_reflection_samples=max(1, cfg.sft_eval_samples // 4),
            reflection_max_new_tokens=cfg.rl_reflection_max_new_tokens,
        )
        add(name, "sft", argv + matched + _train_args(cfg, runs / name), needs, runs / name)

    rl_env_kwargs = {**cfg.env_kwargs, **(cfg.rl_env_kwargs if cfg.rl_env_kwargs is not None else {})}
    if cfg.rl_env_kwargs is None:
        rl_env_kwargs.update(RL_ENV_KWARGS.get(cfg.env_name, {}))

    def rl(name: str) -> None:
        run = RL_RUNS[name]
        temperature = 1.0 if run.sampled_reflections else protocol.rl_reflection_temperature
        argv = flags(
            model_name_or_path=runs / run.policy,
            reflection_model_name_or_path=runs / run.reflection if run.reflection else "none",
            env_name=cfg.env_name,
            env_kwargs=json.dumps(rl_env_kwargs),
            max_steps=rl_steps,
            per_device_train_batch_size=cfg.rl_batch_size,
            num_generations=cfg.rl_num_generations,
            num_iterations=cfg.rl_num_iterations,
            learning_rate=cfg.rl_learning_rate,
            advantage_estimator=cfg.rl_advantage_estimator,
            gamma=cfg.rl_gamma,
            beta=cfg.rl_beta,
            reflection_max_new_tokens=cfg.rl_reflection_max_new_tokens,
            reflection_temperature=temperature,
            curriculum=run.curriculum,
            logging_steps=1,
            log_episodes_every=max(1, rl_steps // 3),
        )
        # only when set, so that the runs of the other settings keep their command lines (and are reused)
        if cfg.rl_skip_no_signal_steps:
            argv += flags(skip_no_signal_steps=True)
        if cfg.rl_tasks == "disjoint":  # start states the SFT data never saw (pipelines.demo.write_rl_tasks)
            argv += flags(train_tasks_file=data / "rl_tasks.jsonl")
        else:
            argv += flags(num_train_tasks=max(cfg.n_train_tasks, 8), task_seed=cfg.seed)
        if run.train_reflection:
            argv += flags(
                train_reflection=True,
                train_policy=run.train_policy,
                reflection_learning_rate=cfg.rl_reflection_learning_rate,
            )
            # only when not the default, so that the runs of the other settings keep their command lines
            if run.reflection_reward != "advantage":
                argv += flags(reflection_reward=run.reflection_reward)
            if run.reflection_reward == "mixed":
                argv += flags(reflection_verified_weight=cfg.rl_reflection_verified_weight)
            if run.reflection_objective != "rl":
                argv += flags(reflection_objective=run.reflection_objective)
        if cfg.rl_eval_steps > 0:  # the greedy validation curve of the run
            argv += flags(
                eval_strategy="steps",
                eval_steps=cfg.rl_eval_steps,
                eval_on_start="true",
                eval_episodes_per_stage=cfg.rl_eval_episodes_per_stage,
            )
        if run.reflection and reflection_base_url:  # the served model is named by its path
            argv += flags(reflection_backend="openai", reflection_base_url=reflection_base_url)
        if not run.curriculum:  # the paper's "w/o curriculum": train on the hardest stage only
            argv += flags(curriculum_stages=rl_stages_of(cfg)[-1])
        elif cfg.rl_stages:
            argv += flags(curriculum_stages=",".join(cfg.rl_stages))
        needs = (run.policy,) + ((run.reflection,) if run.reflection else ())
        add(name, "rl", argv + _train_args(cfg, runs / name), needs, runs / name)

    # long chains first: the reflection SFT runs feed everything else
    order = [
        r
        for r in wanted
        if r in SFT_RUNS and SFT_RUNS[r][1] == "reflection" and r != "sft_reflection_label_matched"
    ]
    order += [r for r in wanted if r in SFT_RUNS and SFT_RUNS[r][1] == "policy" and r != "sft_plain"]
    order += [r for r in wanted if r in RL_RUNS and r != "rl_plain"]
    order += [r for r in ("sft_plain", "rl_plain", "sft_reflection_label_matched") if r in wanted]
    for name in order:
        (sft if name in SFT_RUNS else rl)(name)
    return list(jobs.values())


__all__ = [
    "CONFIGURATIONS",
    "ENV_DEMO_SETTINGS",
    "LOOKUP_STARTED",
    "LOOKUP_WARM_UP_STEPS",
    "PROTOCOLS",
    "RL_RUNS",
    "SFT_RUNS",
    "Configuration",
    "Protocol",
    "RLRun",
    "configurations_of",
    "demo_jobs",
    "env_demo_settings",
    "flags",
    "needed_runs",
    "rl_stages_of",
    "relabelled",
    "sft_dataset",
    "sft_learning_rate",
]
