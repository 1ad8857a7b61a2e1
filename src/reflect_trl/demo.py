"""``make demo``: the whole Reflect-RL method end to end on tiny offline models, on a CPU.

Steps (each prints progress and its wall time):

1. build a tiny Llama + BPE tokenizer (offline);
2. generate SFT data (DangerousTaxi by default) with negative examples (and the positive-only variants);
3. SFT warm-ups: reflection model (with / without negatives), policy with reflection (with / without
   negatives), plain policy;
4. online RL of the policy for four variants (the paper's ablations);
5. evaluate the five ablation rows, plus RL's starting point ("Reflect SFT (before RL)"), on held-out tasks;
   write the results table (markdown + JSON), PNG plots, and keep the wandb offline run directories.

Everything lands in ``outputs/demo/`` (configurable) and is reproducible for a seed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from reflect_trl.pipeline import Job, run_jobs


@dataclass
class DemoConfig:
    output_dir: str = "outputs/demo"
    env_name: str = "taxi"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    # Extra environment kwargs for the RL rollouts only (evaluation keeps the environment's own rewards); None = the
    # default for the environment in RL_ENV_KWARGS.
    rl_env_kwargs: dict[str, Any] | None = None
    seed: int = 0
    model_preset: str = "tiny"
    # The policy's size (SFT only, SFT + RL, every Reflect policy); None = model_preset. The reflection model keeps
    # model_preset. A larger policy needs its own learning rates (docs/experiments.md §5: `small` at SFT lr 3e-4).
    policy_preset: str | None = None
    # Llama (rotary positions) learns the option-label task far faster than GPT-2 at this size.
    model_arch: str = "llama"
    # data
    n_train_tasks: int = 100
    n_val_tasks: int = 20
    negative_prob: float = 0.5
    # SFT
    sft_policy_steps: int = 400
    # 1500 steps: the reflections name the oracle's action in 90.3 % of the 558 validation rows (1200: 87.5 %) and the
    # Reflect policy reaches 34 % on `full` instead of 23 % (seed 0, validation; docs/experiments.md §2)
    sft_reflection_steps: int = 1500
    sft_batch_size: int = 16
    sft_learning_rate: float = 3e-3
    # the policy SFT runs' learning rate (None = sft_learning_rate). 1e-3 for every chain: at 3e-3 a policy SFT sits
    # on an edge where float rounding decides whether it converges (seed 0's Reflect policy stalled at 79-81 % option
    # accuracy, 94 % at 1e-3; the positive-only policy stalled on two seeds of three), and on `validation` the chain
    # with negatives did within 2 points at 1e-3 (docs/experiments.md §1, §2)
    sft_policy_learning_rate: float | None = 1e-3
    # learning rates of single SFT runs (SFT_RUNS names), over the two above
    sft_run_learning_rates: dict[str, float] = field(default_factory=dict)
    sft_eval_samples: int = 96
    # "model": the policies learn on the reflections they will read in the loop -- the oracle's reflections in their
    # SFT data are replaced by the SFT'd reflection model's own (reflect-trl relabel; targets stay the oracle's);
    # "oracle": the data builder's oracle reflections (the paper's data).
    policy_reflections: str = "model"
    # RL
    rl_steps: int = 300
    rl_batch_size: int = 16  # episodes per step
    rl_num_generations: int = 4
    rl_learning_rate: float = 1e-3
    rl_advantage_estimator: str = "gigpo"
    rl_gamma: float = 0.95
    rl_beta: float = 0.05  # KL to the SFT policy: keeps RL from collapsing the policy (docs/experiments.md)
    rl_reflection_max_new_tokens: int = 48
    rl_num_iterations: int = 2
    # SFT anchor (PPO-ptx): > 0 adds this weight x the cross-entropy of rows of each RL run's own policy SFT data to
    # its RL loss (ReflectPPOConfig.sft_anchor_coef); off by default -- no greedy gain measured (docs/experiments.md §5)
    rl_sft_anchor_coef: float = 0.0
    # Uniform exploration (ReflectPPOConfig.exploration_epsilon) and failure-prioritised task draws (task_sampling
    # "failures") for every RL run; off by default -- no greedy gain measured with the tiny policy (§5)
    rl_exploration_epsilon: float = 0.0
    rl_task_sampling: str = "uniform"
    # > 0: every RL run evaluates itself during training (ReflectPPOTrainer.evaluate) at its start and every
    # rl_eval_steps steps, greedily, on rl_eval_episodes_per_stage `validation` episodes per stage (seed 777);
    # the curves go to each run's log and to eval_curves.png. Off by default: one evaluation of 300 episodes per stage
    # took 9-41 s here, median 11-14 s (docs/experiments.md §1).
    rl_eval_steps: int = 0
    rl_eval_episodes_per_stage: int = 100
    # "hf": RL and evaluation play the reflection models in their own processes; "openai": the demo starts a local
    # `transformers serve` (pip install -e '.[serve]') and RL / evaluation request the SFT'd reflection models from
    # it by path, as they would from vLLM / SGLang / TGI (docs/serving.md). Same prompts and stop marker.
    reflection_backend: str = "hf"
    # eval
    eval_episodes_per_stage: int = 300
    eval_decodings: list[str] = field(default_factory=lambda: ["greedy"])
    report_to: str = "wandb"
    # torch intra-op threads (0 = torch's default)
    torch_threads: int = 0
    # SFT / relabel / RL steps run at once, each in its own process with one thread (1 = one after the other, in
    # this process)
    jobs: int = 2

    @classmethod
    def smoke(cls, output_dir: str) -> DemoConfig:
        """A handful of steps per stage: exercises every step and writes every output file in well under a minute."""
        return cls(
            output_dir=output_dir,
            model_preset="nano",
            n_train_tasks=6,
            n_val_tasks=3,
            sft_policy_steps=3,
            sft_reflection_steps=3,
            sft_batch_size=8,
            rl_steps=3,
            rl_batch_size=4,
            rl_num_generations=2,
            rl_reflection_max_new_tokens=6,
            rl_num_iterations=1,
            eval_episodes_per_stage=3,
            eval_decodings=["greedy"],
            sft_eval_samples=4,
            report_to="none",
            jobs=1,
        )


# Environment kwargs the demo uses unless --env_kwargs is given (kept small for the tiny models' context).
DEFAULT_ENV_KWARGS: dict[str, dict[str, Any]] = {
    "auto_explore": {"horizon": 15, "max_content_tokens": 48, "max_content_lines": 8},
}

# RL-only environment kwargs. DangerousTaxi's -1 raw step cost makes an early crash cheaper than a late one, so a
# policy that rarely succeeds learns to crash fast (docs/experiments.md); the demo's RL drops the step cost.
# (AutoExplore's step_cost=0 removes the same incentive there, but with the tiny models it measured worse and 4x
# slower than the cost table, docs/experiments.md §6, so the demo keeps the table.)
RL_ENV_KWARGS: dict[str, dict[str, Any]] = {"taxi": {"step_reward": 0.0}}

# Variants: name -> (policy SFT data, reflection SFT data or None, RL settings or None)
SFT_RUNS = {
    # name: (data set, role, reflection model whose own reflections replace the oracle's in the policy data)
    "sft_reflection": ("reflection", "reflection", None),
    "sft_reflection_positive": ("reflection_positive", "reflection", None),
    "sft_policy": ("policy_reflect", "policy", "sft_reflection"),
    "sft_policy_positive": ("policy_reflect_positive", "policy", "sft_reflection_positive"),
    "sft_plain": ("policy_plain", "policy", None),
}
RL_RUNS = {
    # name: (policy init, reflection model, curriculum)
    "rl_plain": ("sft_plain", None, True),
    "rl_reflect": ("sft_policy", "sft_reflection", True),
    "rl_reflect_no_negatives": ("sft_policy_positive", "sft_reflection_positive", True),
    "rl_reflect_no_curriculum": ("sft_policy", "sft_reflection", False),
}
TABLE_ROWS = [
    # (row label, policy run, reflection run)
    ("SFT only", "sft_plain", None),
    ("SFT + RL w/o reflection", "rl_plain", None),
    ("Reflect SFT (before RL)", "sft_policy", "sft_reflection"),  # not an ablation: RL's starting point
    ("Reflect-RL", "rl_reflect", "sft_reflection"),
    ("Reflect-RL w/o negative examples", "rl_reflect_no_negatives", "sft_reflection_positive"),
    ("Reflect-RL w/o curriculum", "rl_reflect_no_curriculum", "sft_reflection"),
]


class _Progress:
    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.timings: dict[str, float] = {}

    def step(self, name: str):
        progress = self

        class _Timer:
            def __enter__(self_inner):
                self_inner.t0 = time.perf_counter()
                print(f"\n[demo {progress.elapsed()}] >>> {name}", flush=True)

            def __exit__(self_inner, *exc):
                seconds = time.perf_counter() - self_inner.t0
                progress.timings[name] = seconds
                if exc[0] is None:
                    print(f"[demo {progress.elapsed()}] <<< {name} done in {seconds:.1f}s", flush=True)

        return _Timer()

    def elapsed(self) -> str:
        s = int(time.perf_counter() - self.start)
        return f"{s // 60:02d}:{s % 60:02d}"


def _finish_wandb() -> None:
    try:
        import wandb

        if wandb.run is not None:
            wandb.finish()
    except ImportError:  # pragma: no cover
        pass


def _flags(**values: Any) -> list[str]:
    """``--key value`` pairs for a CLI argv (booleans as true/false)."""
    argv: list[str] = []
    for key, value in values.items():
        argv += [f"--{key}", ("true" if value else "false") if isinstance(value, bool) else str(value)]
    return argv


def _common_train_args(cfg: DemoConfig, run_dir: Path) -> list[str]:
    run_dir.mkdir(parents=True, exist_ok=True)
    return _flags(
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
    cfg: DemoConfig,
    base: Path,
    data: Path,
    runs: Path,
    reflection_base_url: str | None = None,
    policy_base: Path | None = None,
) -> list[Job]:
    """The demo's SFT, relabel and RL steps as a job graph (long chains first); the policy SFT runs start from
    ``policy_base`` (default: ``base``); with ``reflection_base_url`` the RL steps request their reflections from that
    server."""
    jobs: dict[str, Job] = {}

    def add(
        name: str, command: str, argv: list[str], needs: tuple[str, ...] = (), run_dir: Path | None = None
    ):
        env = {"WANDB_DIR": str(run_dir.resolve())} if run_dir is not None else {}
        jobs[name] = Job(name, command, argv, needs, env)

    def sft(name: str) -> None:
        dataset, role, reflector = SFT_RUNS[name]
        steps = cfg.sft_reflection_steps if role == "reflection" else cfg.sft_policy_steps
        needs: tuple[str, ...] = ()
        if relabelled(cfg, name):
            # the policy learns on the reflections it will read: the SFT'd reflection model's (reflect-trl relabel)
            relabel = f"relabel_{name}"
            add(
                relabel,
                "relabel",
                _flags(
                    dataset=data / f"{dataset}.jsonl",
                    reflection_model=runs / reflector,
                    output=sft_dataset(cfg, name, data),
                    max_new_tokens=cfg.rl_reflection_max_new_tokens,
                    seed=cfg.seed,
                )
                + ["--replace"],
                (reflector,),
            )
            needs = (relabel,)
        argv = _flags(
            model_name_or_path=(policy_base or base) if role == "policy" else base,
            dataset_path=sft_dataset(cfg, name, data),
            env_name=cfg.env_name,
            role=role,
            max_steps=steps,
            per_device_train_batch_size=cfg.sft_batch_size,
            learning_rate=sft_learning_rate(cfg, name),
            lr_scheduler_type="cosine",
            warmup_steps=max(1, steps // 20),
            logging_steps=max(1, steps // 10),
            eval_strategy="no",
            max_length=1024,
            max_eval_samples=cfg.sft_eval_samples,
            eval_num_policy_samples=cfg.sft_eval_samples,
            eval_num_reflection_samples=max(1, cfg.sft_eval_samples // 4),
            reflection_max_new_tokens=cfg.rl_reflection_max_new_tokens,
        )
        add(name, "sft", argv + _common_train_args(cfg, runs / name), needs, runs / name)

    rl_env_kwargs = {
        **cfg.env_kwargs,
        **(cfg.rl_env_kwargs if cfg.rl_env_kwargs is not None else RL_ENV_KWARGS.get(cfg.env_name, {})),
    }

    def rl(name: str) -> None:
        policy, reflection, curriculum = RL_RUNS[name]
        argv = _flags(
            model_name_or_path=runs / policy,
            reflection_model_name_or_path=runs / reflection if reflection else "none",
            env_name=cfg.env_name,
            env_kwargs=json.dumps(rl_env_kwargs),
            max_steps=cfg.rl_steps,
            per_device_train_batch_size=cfg.rl_batch_size,
            num_generations=cfg.rl_num_generations,
            num_iterations=cfg.rl_num_iterations,
            learning_rate=cfg.rl_learning_rate,
            advantage_estimator=cfg.rl_advantage_estimator,
            gamma=cfg.rl_gamma,
            beta=cfg.rl_beta,
            reflection_max_new_tokens=cfg.rl_reflection_max_new_tokens,
            reflection_temperature=0,
            num_train_tasks=rl_train_tasks(cfg),
            task_seed=cfg.seed,
            curriculum=curriculum,
            logging_steps=1,
            log_episodes_every=max(1, cfg.rl_steps // 3),
        )
        if cfg.rl_exploration_epsilon > 0:
            argv += _flags(exploration_epsilon=cfg.rl_exploration_epsilon)
        if cfg.rl_task_sampling != "uniform":
            argv += _flags(task_sampling=cfg.rl_task_sampling)
        if cfg.rl_sft_anchor_coef > 0:  # the anchor rows are the ones this run's policy was SFT'd on
            argv += _flags(
                sft_anchor_data=sft_dataset(cfg, policy, data), sft_anchor_coef=cfg.rl_sft_anchor_coef
            )
        if cfg.rl_eval_steps > 0:  # the greedy validation curve of the run
            argv += _flags(
                eval_strategy="steps",
                eval_steps=cfg.rl_eval_steps,
                eval_on_start="true",
                eval_episodes_per_stage=cfg.rl_eval_episodes_per_stage,
            )
        if reflection and reflection_base_url:  # the served model is named by its path
            argv += _flags(reflection_backend="openai", reflection_base_url=reflection_base_url)
        if not curriculum:  # the paper's "w/o curriculum": train on the hardest stage only
            argv += _flags(curriculum_stages=_stages(cfg)[-1])
        needs = (policy,) + ((reflection,) if reflection else ())
        add(name, "rl", argv + _common_train_args(cfg, runs / name), needs, runs / name)

    for name in ("sft_reflection", "sft_reflection_positive", "sft_policy", "sft_policy_positive"):
        sft(name)
    for name in ("rl_reflect", "rl_reflect_no_negatives", "rl_reflect_no_curriculum"):
        rl(name)
    sft("sft_plain")
    rl("rl_plain")
    return list(jobs.values())


def sft_learning_rate(cfg: DemoConfig, sft_run: str) -> float:
    """The learning rate of the SFT run ``sft_run``: its own in ``sft_run_learning_rates``, else
    ``sft_policy_learning_rate`` for a policy run (when set), else ``sft_learning_rate``."""
    if sft_run in cfg.sft_run_learning_rates:
        return cfg.sft_run_learning_rates[sft_run]
    if SFT_RUNS[sft_run][1] == "policy" and cfg.sft_policy_learning_rate is not None:
        return cfg.sft_policy_learning_rate
    return cfg.sft_learning_rate


def relabelled(cfg: DemoConfig, sft_run: str) -> bool:
    """Whether the policy SFT run ``sft_run`` learns on its reflection model's own reflections (reflect-trl relabel)."""
    _, role, reflector = SFT_RUNS[sft_run]
    return role == "policy" and reflector is not None and cfg.policy_reflections == "model"


def sft_dataset(cfg: DemoConfig, sft_run: str, data: Path) -> Path:
    """The data set the SFT run ``sft_run`` trains on (the relabelled copy where :func:`relabelled`)."""
    dataset = SFT_RUNS[sft_run][0]
    return data / (f"{dataset}_model" if relabelled(cfg, sft_run) else dataset)


def rl_train_tasks(cfg: DemoConfig) -> int:
    """Training tasks per stage of the demo's RL runs (the SFT data's, at least 8 for the RL batches)."""
    return max(cfg.n_train_tasks, 8)


def demo_eval_settings(cfg: DemoConfig, reflection_base_url: str | None = None):
    """The held-out evaluation of a demo run (``test`` split, seed ``cfg.seed + 1000``)."""
    from reflect_trl.evaluation import EvalSettings

    return EvalSettings(
        env_name=cfg.env_name,
        env_kwargs=dict(cfg.env_kwargs),
        episodes_per_stage=cfg.eval_episodes_per_stage,
        decodings=list(cfg.eval_decodings),
        seed=cfg.seed + 1000,
        reflection_max_new_tokens=cfg.rl_reflection_max_new_tokens,
        reflection_temperature=1.0,
        **(
            {"reflection_backend": "openai", "reflection_base_url": reflection_base_url}
            if reflection_base_url
            else {}
        ),
    )


def demo_eval_configurations(runs: Path):
    """The evaluated configurations of a demo run (the rows of its table), from its ``runs`` folder."""
    from reflect_trl.evaluation import EvalConfiguration

    return [
        EvalConfiguration(label, str(runs / policy), str(runs / refl) if refl else None)
        for label, policy, refl in TABLE_ROWS
    ]


def prepare_demo(cfg: DemoConfig, progress: _Progress) -> tuple[Path, Path | None, Path]:
    """Steps 1-2 of the demo: record the configuration, build the untrained models and the SFT data. Returns the
    base model, the policies' base model (None: the same) and the data folder."""
    from reflect_trl.data_builder import DataBuilderConfig, build_datasets
    from reflect_trl.tracking import configure_tracking

    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo_config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    # a summary describes a finished run of this configuration only
    (out / "summary.json").unlink(missing_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    configure_tracking(cfg.report_to, out)

    with progress.step("1/5 tiny model + tokenizer"):
        base, policy_base = base_models(cfg, out / "models")

    with progress.step(f"2/5 {cfg.env_name} data with negative examples"):
        data_config = DataBuilderConfig(
            env_name=cfg.env_name,
            env_kwargs=dict(cfg.env_kwargs),
            n_train_tasks=cfg.n_train_tasks,
            n_val_tasks=cfg.n_val_tasks,
            negative_prob=cfg.negative_prob,
            seed=cfg.seed,
            output_dir=str(out / "data"),
        )
        build_datasets(data_config)
    return base, policy_base, out / "data" / cfg.env_name


def _set_torch_threads(cfg: DemoConfig) -> None:
    if cfg.torch_threads:
        import torch

        torch.set_num_threads(cfg.torch_threads)


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    _set_torch_threads(cfg)
    progress = _Progress()
    out = Path(cfg.output_dir)
    runs = out / "runs"
    base, policy_base, data = prepare_demo(cfg, progress)

    with contextlib.ExitStack() as stack:
        base_url = None
        if cfg.reflection_backend == "openai":
            from reflect_trl.reflection.serve import local_reflection_server

            base_url = stack.enter_context(local_reflection_server(out / "logs" / "reflection_server.log"))
            print(
                f"[demo {progress.elapsed()}]     reflection server (transformers serve) at {base_url}",
                flush=True,
            )
        _train(cfg, progress, base, policy_base, data, runs, out, base_url)
        report, paths, plots = evaluate_demo_runs(cfg, progress, base_url)
    return _finish(cfg, progress, report, paths, plots, runs, out)


JOB_TIMINGS = "job_timings.json"


def finish_pooled_demo(cfg: DemoConfig) -> dict[str, Any]:
    """The last step of a demo whose SFT / relabel / RL jobs ran elsewhere (``reflect-trl reproduce``'s shared pool;
    ``reflect-trl demo --evaluate_only``): evaluate its runs and write its summary. The step timings and the start
    time come from ``<output_dir>/job_timings.json`` when the pool wrote one."""
    from reflect_trl.errors import UsageError

    _set_torch_threads(cfg)
    out = Path(cfg.output_dir)
    runs = out / "runs"
    missing = sorted(
        {
            run
            for _, policy, reflection in TABLE_ROWS
            for run in (policy, reflection)
            if run and not (runs / run / "config.json").is_file()
        }
    )
    if missing:
        raise UsageError(
            f"--evaluate_only: {runs} has no finished run {missing}; run the demo (or reproduce) first"
        )
    trained = out / "demo_config.json"
    if trained.is_file():  # the runs must be this configuration's (the evaluation settings may differ)
        recorded_cfg = json.loads(trained.read_text())
        differ = sorted(
            k
            for k, v in json.loads(json.dumps(asdict(cfg))).items()
            if not k.startswith("eval_") and k in recorded_cfg and recorded_cfg[k] != v
        )
        if differ:
            raise UsageError(
                f"--evaluate_only: the runs in {out} were trained with other settings ({trained}) for {differ}; "
                f"pass --config {trained}"
            )
    progress = _Progress()
    recorded = json.loads((out / JOB_TIMINGS).read_text()) if (out / JOB_TIMINGS).is_file() else {}
    progress.timings.update(recorded.get("timings_seconds", {}))
    if "start_time" in recorded:  # wall time since the seed's first step (other seeds' jobs may overlap it)
        progress.start -= time.time() - float(recorded["start_time"])
    (out / "summary.json").unlink(missing_ok=True)
    report, paths, plots = evaluate_demo_runs(cfg, progress)
    return _finish(cfg, progress, report, paths, plots, runs, out)


def base_models(cfg: DemoConfig, models: Path) -> tuple[Path, Path | None]:
    """Build the untrained models: ``tiny-<arch>`` (``model_preset``; the reflection models, and the policies unless
    ``policy_preset`` differs) and, when it does, ``policy-<preset>-<arch>`` for the policies (returned second, else
    None). Each has its own tokenizer; the players exchange reflections as text."""
    from reflect_trl.tiny_models import build_tiny_model

    def build(path: Path, preset: str) -> Path:
        return Path(
            build_tiny_model(path, arch=cfg.model_arch, preset=preset, seed=cfg.seed, envs=(cfg.env_name,))
        )

    base = build(models / f"tiny-{cfg.model_arch}", cfg.model_preset)
    if cfg.policy_preset is None or cfg.policy_preset == cfg.model_preset:
        return base, None
    return base, build(models / f"policy-{cfg.policy_preset}-{cfg.model_arch}", cfg.policy_preset)


def _train(
    cfg: DemoConfig,
    progress,
    base: Path,
    policy_base: Path | None,
    data: Path,
    runs: Path,
    out: Path,
    base_url,
) -> None:
    jobs = demo_jobs(cfg, base, data, runs, reflection_base_url=base_url, policy_base=policy_base)
    with progress.step(f"3-4/5 SFT, relabel and RL: {len(jobs)} jobs, {cfg.jobs} at a time"):

        def report(name: str, event: str, seconds: float) -> None:
            kind = job_label(next(j for j in jobs if j.name == name))
            if event == "start":
                print(f"[demo {progress.elapsed()}]     {kind} {name} started", flush=True)
            else:
                print(f"[demo {progress.elapsed()}]     {kind} {name} done in {seconds:.0f}s", flush=True)
                progress.timings[f"{kind} {name}"] = seconds

        run_jobs(jobs, workers=cfg.jobs, log_dir=out / "logs", report=report)


def job_label(job: Job) -> str:
    """The kind of a demo job as its timing key names it (``SFT``, ``RL``, ``relabel``)."""
    return {"sft": "SFT", "rl": "RL", "relabel": "relabel"}.get(job.command, job.command)


def evaluate_demo_runs(cfg: DemoConfig, progress, base_url: str | None = None):
    """Step 5: the held-out evaluation of the demo's runs, the learning curves and the success bars."""
    from reflect_trl.evaluation import evaluate
    from reflect_trl.plotting import (
        load_log_history,
        plot_eval_curves_if_logged,
        plot_learning_curves,
        plot_success_bars,
    )

    out = Path(cfg.output_dir)
    runs = out / "runs"
    with progress.step("5/5 evaluation, table and plots"):
        settings = demo_eval_settings(cfg, base_url)
        report = evaluate(demo_eval_configurations(runs), settings)
        paths = report.write(out / "eval")
        curves = {
            label: load_log_history(runs / policy)
            for label, policy, _ in TABLE_ROWS
            if policy.startswith("rl_")
        }
        plots = [plot_learning_curves(curves, out / "learning_curves.png")]
        plots += plot_eval_curves_if_logged(curves, out / "eval_curves.png")  # rl_eval_steps > 0
        for decoding in cfg.eval_decodings:
            plots.append(
                plot_success_bars(
                    [asdict(r) for r in report.results],
                    out / f"success_bars_{decoding}.png",
                    decoding=decoding,
                )
            )
    return report, paths, plots


def _finish(cfg: DemoConfig, progress, report, paths, plots, runs: Path, out: Path) -> dict[str, Any]:
    summary = {
        "config": asdict(cfg),
        "timings_seconds": progress.timings,
        "total_seconds": time.perf_counter() - progress.start,
        "results": [asdict(r) for r in report.results],
        "sft_metrics": {
            name: json.loads((runs / name / "sft_metrics.json").read_text())
            for name in SFT_RUNS
            if (runs / name / "sft_metrics.json").is_file()
        },
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "results.md").write_text(results_markdown(summary, report.markdown()))
    wandb_dirs = sorted(str(p) for p in runs.glob("*/wandb/offline-run-*"))
    print("\n" + report.markdown())
    print(f"[demo] finished in {summary['total_seconds'] / 60:.1f} min. Outputs:")
    print(f"  results table : {paths['markdown']} and {paths['json']} (summary: {out / 'results.md'})")
    print(f"  transcripts   : {out / 'eval' / 'transcripts'}")
    print(f"  plots         : {', '.join(str(p) for p in plots)}")
    print(f"  runs          : {runs} (models, log_history.json, episodes/)")
    print(
        f"  wandb offline : {len(wandb_dirs)} run dir(s) under {runs}/*/wandb (upload with `wandb sync <dir>`)"
    )
    return summary


def _stages(cfg: DemoConfig) -> list[str]:
    from reflect_trl.envs import get_env_class

    return list(get_env_class(cfg.env_name).stages)


def results_markdown(summary: dict[str, Any], table: str) -> str:
    cfg = summary["config"]
    timings = "\n".join(f"| {k} | {v:.0f} s |" for k, v in summary["timings_seconds"].items())
    return (
        "# reflect-trl demo results\n\n"
        f"Seed {cfg['seed']}, tiny {cfg['model_arch']} {_players(cfg)}, env `{cfg['env_name']}`, "
        f"total wall time {summary['total_seconds'] / 60:.1f} min.\n\n{table}\n"
        f"| step | wall time |\n|---|---|\n{timings}\n"
    )


def _players(cfg: dict[str, Any]) -> str:
    policy = cfg.get("policy_preset") or cfg["model_preset"]
    if policy == cfg["model_preset"]:
        return f"preset `{policy}` for both players"
    return f"preset `{cfg['model_preset']}` for the reflection model and `{policy}` for the policy"


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
        if isinstance(current, list):
            from reflect_trl.config_lists import parse_list

            return parse_list(value, f"--{key}") or []
        annotation = str(DemoConfig.__dataclass_fields__[key].type)
        if "None" in annotation:  # an optional field ("float | None", "str | None"): "none" gives None
            if value.lower() == "none":
                return None
            return float(value) if annotation.startswith("float") else value
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


def check_demo_config(cfg: DemoConfig) -> None:
    """Up-front checks of a demo configuration (before anything is written): the environment, its kwargs and oracle
    reflector, the model, the counts and the choices. Raises :class:`~reflect_trl.errors.UsageError`."""
    from reflect_trl.curriculum import TASK_SAMPLINGS
    from reflect_trl.errors import UsageError, describe
    from reflect_trl.evaluation import DECODINGS
    from reflect_trl.reflection import get_oracle_reflector
    from reflect_trl.rl_math import ADVANTAGE_ESTIMATORS
    from reflect_trl.tiny_models import ARCHITECTURES, PRESETS
    from reflect_trl.validation import check_env

    env = check_env(cfg.env_name, cfg.env_kwargs)
    if cfg.rl_env_kwargs:
        check_env(cfg.env_name, {**cfg.env_kwargs, **cfg.rl_env_kwargs}, what="rl_env_kwargs")
    try:
        get_oracle_reflector(cfg.env_name)
    except (KeyError, ImportError) as err:
        raise UsageError(f"env_name {cfg.env_name!r}: {describe(err)}") from err
    choices = {
        "model_arch": (cfg.model_arch, ARCHITECTURES),
        "model_preset": (cfg.model_preset, tuple(PRESETS)),
        "policy_preset": (cfg.policy_preset or cfg.model_preset, tuple(PRESETS)),
        "rl_advantage_estimator": (cfg.rl_advantage_estimator, ADVANTAGE_ESTIMATORS),
    }
    for name, (value, allowed) in choices.items():
        if value not in allowed:
            raise UsageError(f"{name} {value!r}: choose one of {list(allowed)}")
    if cfg.reflection_backend not in ("hf", "openai"):
        raise UsageError(f"reflection_backend {cfg.reflection_backend!r}: choose 'hf' or 'openai'")
    if cfg.reflection_backend == "openai":
        from reflect_trl.reflection.serve import check_serving_installed

        check_serving_installed("reflection_backend 'openai' (the demo serves its own reflection models)")
    bad = [d for d in cfg.eval_decodings if d not in DECODINGS]
    if bad or not cfg.eval_decodings:
        raise UsageError(f"eval_decodings {cfg.eval_decodings}: choose from {list(DECODINGS)}")
    positive = (
        "n_train_tasks",
        "n_val_tasks",
        "sft_policy_steps",
        "sft_reflection_steps",
        "sft_batch_size",
        "rl_steps",
        "rl_batch_size",
        "rl_num_generations",
        "rl_num_iterations",
        "eval_episodes_per_stage",
        "rl_eval_episodes_per_stage",
        "jobs",
    )
    if cfg.policy_reflections not in ("model", "oracle"):
        raise UsageError(f"policy_reflections {cfg.policy_reflections!r}: choose 'model' or 'oracle'")
    if not 0.0 <= cfg.rl_gamma <= 1.0:
        raise UsageError(f"rl_gamma must be in [0, 1], got {cfg.rl_gamma}")
    for name in ("sft_learning_rate", "sft_policy_learning_rate", "rl_learning_rate"):
        value = getattr(cfg, name)
        if value is not None and not value > 0:
            raise UsageError(f"{name} must be > 0, got {value}")
    for run, value in cfg.sft_run_learning_rates.items():
        if run not in SFT_RUNS:
            raise UsageError(f"sft_run_learning_rates: unknown SFT run {run!r}; choose from {list(SFT_RUNS)}")
        if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
            raise UsageError(f"sft_run_learning_rates[{run!r}] must be a number > 0, got {value!r}")
    if not 0.0 <= cfg.rl_exploration_epsilon < 1.0:
        raise UsageError(f"rl_exploration_epsilon must be in [0, 1), got {cfg.rl_exploration_epsilon}")
    if cfg.rl_task_sampling not in TASK_SAMPLINGS:
        raise UsageError(f"rl_task_sampling {cfg.rl_task_sampling!r}: choose one of {list(TASK_SAMPLINGS)}")
    if cfg.rl_sft_anchor_coef < 0:
        raise UsageError(f"rl_sft_anchor_coef must be >= 0, got {cfg.rl_sft_anchor_coef}")
    if cfg.rl_eval_steps < 0:
        raise UsageError(f"rl_eval_steps must be >= 0 (0: no evaluation during RL), got {cfg.rl_eval_steps}")
    for name in positive:
        if getattr(cfg, name) < 1:
            raise UsageError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.rl_batch_size % cfg.rl_num_generations:
        raise UsageError(
            f"rl_batch_size {cfg.rl_batch_size} must be a multiple of rl_num_generations {cfg.rl_num_generations}"
        )
    if cfg.rl_steps < len(env.stages):
        raise UsageError(
            f"rl_steps {cfg.rl_steps}: the curriculum needs at least one step per stage {env.stages}"
        )
    if not 0.0 <= cfg.negative_prob <= 1.0:
        raise UsageError(f"negative_prob must be in [0, 1], got {cfg.negative_prob}")


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
        help="only the last step: evaluate the finished runs in --output_dir and write the table and summary",
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
    if args.env_kwargs:
        cfg = replace(cfg, env_kwargs=_parse_field("env_kwargs", {}, args.env_kwargs, parser))
    elif "env_kwargs" not in from_file:  # the environment's demo defaults
        cfg = replace(cfg, env_kwargs=DEFAULT_ENV_KWARGS.get(cfg.env_name, {}))
    cfg = replace(cfg, **parse_demo_overrides(rest, parser))
    check_demo_config(cfg)
    return cfg


def demo_cli(argv: Sequence[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = demo_config_from_cli(argv)
    return finish_pooled_demo(cfg) if "--evaluate_only" in argv else run_demo(cfg)
