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

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reflect_trl.pipelines.jobs import Job, run_jobs
from reflect_trl.pipelines.protocols import (
    CONFIGURATIONS,
    LOOKUP_WARM_UP_STEPS,
    PROTOCOLS,
    SFT_RUNS,
    check_data_settings,
    configuration_rows,
    data_builder_config,
    demo_jobs,
    rl_stages_of,
    rl_steps_of,
)
from reflect_trl.pipelines.statistics import exposure_of_results, training_instances


@dataclass
class DemoConfig:
    output_dir: str = "outputs/demo"
    # "strict" (this project's data and greedy reflections in RL) or "paper" (the authors' Taxi data, both players
    # sampled at T = 1): pipelines.protocols
    protocol: str = "strict"
    # the rows of the results table (pipelines.protocols.CONFIGURATIONS); None = the protocol's own
    configurations: list[str] | None = None
    env_name: str = "taxi"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    # Extra environment kwargs for the RL rollouts only (evaluation keeps the environment's own rewards); None = the
    # default for the environment in RL_ENV_KWARGS.
    rl_env_kwargs: dict[str, Any] | None = None
    seed: int = 0
    model_preset: str = "tiny"
    # Llama (rotary positions) learns the option-label task far faster than GPT-2 at this size.
    model_arch: str = "llama"
    # data
    n_train_tasks: int = 100
    n_val_tasks: int = 20
    negative_prob: float = 0.5
    # the "oracle + random p" trajectories' p (None = the protocol's: strict 0, paper the authors' 0.9)
    random_action_prob: float | None = None
    # SFT
    sft_policy_steps: int = 400
    # 1500 steps: the reflections name the oracle's action in 90.3 % of the 558 validation rows (1200: 87.5 %) and the
    # Reflect policy reaches 34 % on `full` instead of 23 % (seed 0, validation; docs/experiments.md §3)
    sft_reflection_steps: int = 1500
    sft_batch_size: int = 16
    sft_learning_rate: float = 3e-3
    # the policy SFT runs' learning rate (None = sft_learning_rate). 1e-3 for every chain: at 3e-3 a policy SFT sits
    # on an edge where float rounding decides whether it converges (seed 0's Reflect policy stalled at 79-81 % option
    # accuracy, 94 % at 1e-3; the positive-only policy stalled on two seeds of three), and on `validation` the chain
    # with negatives did within 2 points at 1e-3 (docs/experiments.md §3)
    sft_policy_learning_rate: float | None = 1e-3
    # > 0: every policy SFT run starts from a warm-up of this many steps on the bare option lookup (`reflect-trl
    # lookup-data`: the reflection and the shuffled options, no state), for environments whose option list changes
    # with the state; the tiny models learned the lookup only this way (8,000 steps: 50-63 % option accuracy;
    # docs/studies/2026-12-07_textworld_settings.md). 0 = no warm-up (DangerousTaxi's list never changes)
    sft_lookup_steps: int = 0
    sft_eval_samples: int = 96
    # RL
    # None = the protocol's (pipelines.protocols.PROTOCOLS): strict 300, paper 900 (docs/experiments.md §1.4g)
    rl_steps: int | None = None
    rl_batch_size: int = 16  # episodes per step
    rl_num_generations: int = 4
    rl_learning_rate: float = 1e-3
    rl_advantage_estimator: str = "gigpo"
    # 1.0, not GiGPO's 0.95: with RL's zero step reward a discounted crash penalty pays for crashing later; chosen on
    # validation (docs/experiments.md §1.4a)
    rl_gamma: float = 1.0
    rl_beta: float = 0.05  # KL to the SFT policy: keeps RL from collapsing the policy (docs/experiments.md)
    # skip the optimizer and scheduler step of an RL step whose batch carries no advantage
    # (ReflectPPOConfig.skip_no_signal_steps), so a stage without successes does not pull the policy back to its SFT
    # start; docs/experiments.md §1.4h measured an earlier form that zeroed the loss but still stepped the optimizer
    rl_skip_no_signal_steps: bool = False
    rl_reflection_max_new_tokens: int = 48
    rl_num_iterations: int = 2
    # "sft": RL on the SFT data's tasks (the same task seed); "disjoint": on start states the SFT data never saw
    # (design D3, scarce demonstrations; the held-out comparisons then count only instances seen by neither)
    rl_tasks: str = "sft"
    # the curriculum stages RL trains on (None = every stage of the environment). Design D3 at K = 30 leaves out
    # DangerousTaxi's `dropoff`: on seeds 1 and 4 the SFT tasks pose all 12 of its start states, so no disjoint RL
    # task exists for it
    rl_stages: list[str] | None = None
    # learning rate of the reflection player in the configurations where it learns (both_learn, reflection_learns)
    rl_reflection_learning_rate: float = 1e-4
    # reflection_reward mixed: weight of the verified advantage (ReflectPPOConfig.reflection_verified_weight)
    rl_reflection_verified_weight: float = 0.5
    # > 0: every RL run evaluates itself during training (ReflectPPOTrainer.evaluate) at its start and every
    # rl_eval_steps steps, greedily, on rl_eval_episodes_per_stage `validation` episodes per stage (seed 777);
    # the curves go to each run's log and to eval_curves.png. Off by default: one evaluation of 300 episodes per stage
    # took 9-41 s here, median 11-14 s (docs/experiments.md §2).
    rl_eval_steps: int = 0
    rl_eval_episodes_per_stage: int = 100
    # "hf": RL and evaluation play the reflection models in their own processes; "openai": the demo starts a local
    # `transformers serve` (pip install -e '.[serve]') and RL / evaluation request the SFT'd reflection models from
    # it by path, as they would from vLLM / SGLang / TGI (docs/serving.md). Same prompts and stop marker.
    reflection_backend: str = "hf"
    # eval
    eval_episodes_per_stage: int = 300
    # "test" (the results), or "validation" (where settings are chosen; the same trained runs are reused)
    eval_split: str = "test"
    # greedy: argmax option, greedy reflections; sampled: both players sample at T = 1 (the authors' evaluation)
    eval_decodings: list[str] = field(default_factory=lambda: ["greedy", "sampled"])
    report_to: str = "wandb"
    # torch intra-op threads (0 = torch's default)
    torch_threads: int = 0
    # SFT / relabel / RL / evaluation jobs run at once, each in its own process with one thread (1 = one after the
    # other, in this process); a configuration's evaluation starts as soon as its runs are trained
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


def rl_train_tasks(cfg: DemoConfig) -> int:
    """Training tasks per stage of the demo's RL runs (the SFT data's, at least 8 for the RL batches)."""
    return max(cfg.n_train_tasks, 8)


def demo_eval_settings(cfg: DemoConfig, reflection_base_url: str | None = None):
    """The held-out evaluation of a demo run (``eval_split``, seed ``cfg.seed + 1000``)."""
    from reflect_trl.evaluation import EvalSettings

    return EvalSettings(
        env_name=cfg.env_name,
        env_kwargs=dict(cfg.env_kwargs),
        episodes_per_stage=cfg.eval_episodes_per_stage,
        decodings=list(cfg.eval_decodings),
        split=cfg.eval_split,
        seed=cfg.seed + 1000,
        reflection_max_new_tokens=cfg.rl_reflection_max_new_tokens,
        reflection_temperature=1.0,
        **(
            {"reflection_backend": "openai", "reflection_base_url": reflection_base_url}
            if reflection_base_url
            else {}
        ),
    )


def demo_eval_configurations(cfg: DemoConfig, runs: Path):
    """The evaluated configurations of a demo run (the rows of its table), from its ``runs`` folder."""
    from reflect_trl.evaluation import EvalConfiguration

    rows = configuration_rows(cfg)
    return [
        EvalConfiguration(c.label, c.policy_path(runs), str(runs / c.reflection) if c.reflection else None)
        for c in rows
    ]


def prepare_demo(cfg: DemoConfig, progress: _Progress) -> tuple[Path, Path]:
    """Steps 1-2 of the demo: record the configuration, build the untrained model and the SFT data. Returns the
    base model and the data folder."""
    from reflect_trl.data.builder import build_datasets
    from reflect_trl.tracking import configure_tracking

    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo_config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    # a summary describes a finished run of this configuration only
    (out / "summary.json").unlink(missing_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    configure_tracking(cfg.report_to, out)

    with progress.step("1/5 tiny model + tokenizer"):
        base = base_model(cfg, out / "models")

    with progress.step(f"2/5 {cfg.env_name} data with negative examples"):
        datasets = build_datasets(data_builder_config(cfg, out / "data"))
        warn_if_options_change(datasets["policy_reflect"], progress, cfg.sft_lookup_steps)
        if cfg.rl_tasks == "disjoint":
            write_rl_tasks(cfg, out / "data" / cfg.env_name / "rl_tasks.jsonl")
    return base, out / "data" / cfg.env_name


def warn_if_options_change(policy_data, progress: _Progress, lookup_steps: int = 0) -> None:
    """The demo's tiny models learn a fixed label per move, but not from the policy rows to look a move up in a list
    that changes with the state (measured in the study that ``option_lists_note`` names): without the warm-up
    (``sft_lookup_steps``), say so before an hour of training."""
    from reflect_trl.envs.check import option_lists_note
    from reflect_trl.prompts import count_option_lists

    prompts = [prompt for split in policy_data.values() for prompt in split["prompt"]]
    distinct = count_option_lists(prompts)
    if distinct > 1 and lookup_steps == 0:
        print(
            f"[demo {progress.elapsed()}] WARNING the policy data shows "
            f"{option_lists_note(distinct, len(prompts), over='policy prompts')}; "
            f"the demo runs that warm-up with --sft_lookup_steps {LOOKUP_WARM_UP_STEPS}",
            flush=True,
        )


def rl_task_list(cfg: DemoConfig) -> list[Any]:
    """The RL runs' training tasks: ``rl_train_tasks(cfg)`` per stage with the SFT data's task seed (``rl_tasks:
    sft``, the same tasks), or (``disjoint``) from the train split with another task seed, keeping only problem
    instances the SFT data never posed."""
    from reflect_trl.envs import make_env

    env = make_env(cfg.env_name, **dict(cfg.env_kwargs))
    chosen = []
    stages = rl_stages_of(cfg)
    for stage in stages:
        if cfg.rl_tasks == "sft":
            chosen += env.make_tasks("train", rl_train_tasks(cfg), seed=cfg.seed, difficulty=stage)
            continue
        sft = env.make_tasks("train", cfg.n_train_tasks, seed=cfg.seed, difficulty=stage)
        seen = {env.instance_key(t) for t in sft}
        pool = env.make_tasks("train", 20 * rl_train_tasks(cfg), seed=cfg.seed + 7919, difficulty=stage)
        fresh = [t for t in pool if env.instance_key(t) not in seen][: rl_train_tasks(cfg)]
        if not fresh:
            others = [s for s in stages if s != stage]
            raise ValueError(
                f"rl_tasks 'disjoint': every {stage!r} training instance is in the SFT data (n_train_tasks "
                f"{cfg.n_train_tasks}); leave the stage out of RL with --rl_stages {','.join(others)}"
            )
        chosen += fresh
    return chosen


def write_rl_tasks(cfg: DemoConfig, path: Path) -> list[Any]:
    """``rl_tasks: disjoint``: :func:`rl_task_list` as JSONL for the RL runs' ``train_tasks_file``."""
    chosen = rl_task_list(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(t.to_dict(), sort_keys=True) + "\n" for t in chosen))
    return chosen


def _set_torch_threads(cfg: DemoConfig) -> None:
    if cfg.torch_threads:
        import torch

        torch.set_num_threads(cfg.torch_threads)


def run_demo(cfg: DemoConfig, rerun: bool = False) -> dict[str, Any]:
    """The whole demo; a training job that finished before in its run folder with the same command line is reused
    (``rerun``: every job runs again)."""
    _set_torch_threads(cfg)
    progress = _Progress()
    out = Path(cfg.output_dir)
    runs = out / "runs"
    base, data = prepare_demo(cfg, progress)

    with contextlib.ExitStack() as stack:
        base_url = None
        if cfg.reflection_backend == "openai":
            from reflect_trl.reflection.serve import local_reflection_server

            base_url = stack.enter_context(local_reflection_server(out / "logs" / "reflection_server.log"))
            print(
                f"[demo {progress.elapsed()}]     reflection server (transformers serve) at {base_url}",
                flush=True,
            )
        _train(cfg, progress, base, data, runs, out, base_url, rerun)
        # the graph evaluated every configuration (or found its evaluation recorded): this step assembles the table
        report, paths, plots = evaluate_demo_runs(cfg, progress, base_url, workers=cfg.jobs)
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
        {run for c in configuration_rows(cfg) for run in c.runs if not (runs / run / "config.json").is_file()}
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


def base_model(cfg: DemoConfig, models: Path) -> Path:
    """Build the untrained model ``tiny-<arch>`` (``model_preset``) that every SFT run starts from, with its tokenizer
    (the players exchange reflections as text)."""
    from reflect_trl.tiny_models import build_tiny_model

    path = models / f"tiny-{cfg.model_arch}"
    return Path(
        build_tiny_model(
            path, arch=cfg.model_arch, preset=cfg.model_preset, seed=cfg.seed, envs=(cfg.env_name,)
        )
    )


def _train(
    cfg: DemoConfig,
    progress,
    base: Path,
    data: Path,
    runs: Path,
    out: Path,
    base_url,
    rerun: bool = False,
) -> None:
    jobs = demo_jobs(cfg, base, data, runs, reflection_base_url=base_url)
    jobs += evaluation_jobs(cfg, jobs, demo_eval_settings(cfg, base_url), reuse=not rerun)
    with progress.step(f"3-5/5 SFT, relabel, RL and evaluation: {len(jobs)} jobs, {cfg.jobs} at a time"):

        def report(name: str, event: str, seconds: float) -> None:
            kind = job_label(next(j for j in jobs if j.name == name))
            if event == "reused":
                print(f"[demo {progress.elapsed()}]     {kind} {name} reused (finished before)", flush=True)
            elif event == "start":
                print(f"[demo {progress.elapsed()}]     {kind} {name} started", flush=True)
            else:
                print(f"[demo {progress.elapsed()}]     {kind} {name} done in {seconds:.0f}s", flush=True)
                progress.timings[f"{kind} {name}"] = seconds

        run_jobs(jobs, workers=cfg.jobs, log_dir=out / "logs", report=report, reuse=not rerun)


def job_label(job: Job) -> str:
    """The kind of a demo job as its timing key names it (``SFT``, ``RL``, ``relabel``, ``evaluation``)."""
    return {"sft": "SFT", "rl": "RL", "relabel": "relabel", "eval": "evaluation"}.get(
        job.command, job.command
    )


def evaluation_jobs(cfg: DemoConfig, training: list[Job], settings, reuse: bool = True) -> list[Job]:
    """One evaluation job per row of the demo's table (:func:`reflect_trl.pipelines.eval_step.configuration_job`),
    needing the jobs that train its runs, so it starts as soon as they are done instead of after every run. With
    ``reuse``, a row gets no job when the jobs of its runs will be reused and its evaluation is recorded."""
    from reflect_trl.pipelines.eval_step import cached_entry, configuration_job
    from reflect_trl.pipelines.jobs import finished_before

    eval_dir = Path(cfg.output_dir) / "eval"
    names = {job.name for job in training}
    kept = {job.name for job in training if reuse and finished_before(job)}
    rows = configuration_rows(cfg)
    jobs = []
    for row, configuration in zip(
        rows, demo_eval_configurations(cfg, Path(cfg.output_dir) / "runs"), strict=True
    ):
        needs = tuple(job for job in row.jobs if job in names)
        if reuse and set(needs) <= kept and cached_entry(configuration, settings, eval_dir) is not None:
            continue
        jobs.append(configuration_job(configuration, settings, eval_dir, needs))
    return jobs


def evaluate_demo_runs(
    cfg: DemoConfig, progress, base_url: str | None = None, reuse: bool = True, workers: int = 1
):
    """Step 5: the held-out evaluation of the demo's runs (in ``workers`` processes), the learning curves and the
    success bars. A configuration evaluated before in the same folder, with the same runs and settings, is reused
    unless ``reuse`` is false (:mod:`reflect_trl.pipelines.eval_step`). ``reproduce`` runs this step as one job of its
    pool, so there it keeps to one process."""
    from reflect_trl.pipelines.eval_step import evaluate_reusing
    from reflect_trl.pipelines.plotting import (
        load_log_history,
        plot_eval_curves_if_logged,
        plot_learning_curves,
        plot_success_bars,
    )

    out = Path(cfg.output_dir)
    runs = out / "runs"
    with progress.step("5/5 evaluation, table and plots"):
        settings = demo_eval_settings(cfg, base_url)
        configurations = demo_eval_configurations(cfg, runs)
        report, paths = evaluate_reusing(configurations, settings, out / "eval", reuse=reuse, workers=workers)
        curves = {
            c.label: load_log_history(runs / c.policy)
            for c in configuration_rows(cfg)
            if c.policy.startswith("rl_")
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
        "rl_steps": rl_steps_of(cfg),  # resolved (config.rl_steps None = the protocol's own)
        "timings_seconds": progress.timings,
        "total_seconds": time.perf_counter() - progress.start,
        "results": [asdict(r) for r in report.results],
        "sft_metrics": {
            name: json.loads((runs / name / "sft_metrics.json").read_text())
            for name in SFT_RUNS
            if (runs / name / "sft_metrics.json").is_file()
        },
    }
    summary["exposure"] = exposure_of_results(summary["results"], training_instances(cfg))
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


def _exposure_markdown(exposure: list[dict[str, Any]]) -> str:
    if not exposure:
        return ""
    lines = [
        "Success on the unseen instances (no SFT or RL task of this run posed them) and the share of the episodes on "
        "seen ones (the splits hold out task seeds, not instances):",
        "",
        "| configuration | decoding | stage | unseen success | unseen episodes | seen share |",
        "|---|---|---|---|---|---|",
    ]
    for e in exposure:
        u = e["unseen"]
        rate = "–" if u["success_rate"] is None else f"{100 * u['success_rate']:.1f}%"
        share = "–" if e["seen_share"] is None else f"{100 * e['seen_share']:.0f}%"
        lines.append(
            f"| {e['configuration']} | {e['decoding']} | {e['stage']} | {rate} | {u['episodes']} | {share} |"
        )
    return "\n".join(lines) + "\n\n"


def results_markdown(summary: dict[str, Any], table: str) -> str:
    cfg = summary["config"]
    timings = "\n".join(f"| {k} | {v:.0f} s |" for k, v in summary["timings_seconds"].items())
    return (
        "# reflect-trl demo results\n\n"
        f"Seed {cfg['seed']}, tiny {cfg['model_arch']} {_players(cfg)}, env `{cfg['env_name']}`, "
        f"total wall time {summary['total_seconds'] / 60:.1f} min.\n\n{table}\n"
        f"{_exposure_markdown(summary.get('exposure') or [])}"
        f"| step | wall time |\n|---|---|\n{timings}\n"
    )


def _players(cfg: dict[str, Any]) -> str:
    return f"preset `{cfg['model_preset']}` for both players"


def check_demo_config(cfg: DemoConfig) -> None:
    """Up-front checks of a demo configuration (before anything is written): the environment, its kwargs and oracle
    reflector, the model, the counts and the choices. Raises :class:`~reflect_trl.errors.UsageError`."""
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
        "rl_batch_size",
        "rl_num_generations",
        "rl_num_iterations",
        "eval_episodes_per_stage",
        "rl_eval_episodes_per_stage",
        "jobs",
    )
    if cfg.protocol not in PROTOCOLS:
        raise UsageError(f"protocol {cfg.protocol!r}: choose one of {list(PROTOCOLS)}")
    unknown = [c for c in cfg.configurations or [] if c not in CONFIGURATIONS]
    if unknown or cfg.configurations == []:
        raise UsageError(f"configurations {cfg.configurations}: choose from {list(CONFIGURATIONS)}")
    if cfg.eval_split not in ("test", "validation"):
        raise UsageError(f"eval_split {cfg.eval_split!r}: choose 'test' or 'validation'")
    if cfg.rl_tasks not in ("sft", "disjoint"):
        raise UsageError(f"rl_tasks {cfg.rl_tasks!r}: choose 'sft' or 'disjoint'")
    if cfg.rl_stages is not None and (
        not cfg.rl_stages
        or len(set(cfg.rl_stages)) < len(cfg.rl_stages)
        or not set(cfg.rl_stages) <= set(env.stages)
    ):
        raise UsageError(
            f"rl_stages {cfg.rl_stages}: choose distinct stages of {cfg.env_name!r} from {list(env.stages)}"
        )
    if not 0.0 <= cfg.rl_reflection_verified_weight <= 1.0:
        raise UsageError(
            f"rl_reflection_verified_weight must be in [0, 1], got {cfg.rl_reflection_verified_weight}"
        )
    if not cfg.rl_reflection_learning_rate > 0:
        raise UsageError(f"rl_reflection_learning_rate must be > 0, got {cfg.rl_reflection_learning_rate}")
    if not 0.0 <= cfg.rl_gamma <= 1.0:
        raise UsageError(f"rl_gamma must be in [0, 1], got {cfg.rl_gamma}")
    for name in ("sft_learning_rate", "sft_policy_learning_rate", "rl_learning_rate"):
        value = getattr(cfg, name)
        if value is not None and not value > 0:
            raise UsageError(f"{name} must be > 0, got {value}")
    if cfg.sft_lookup_steps < 0:
        raise UsageError(
            f"sft_lookup_steps must be >= 0 (0: no option-lookup warm-up), got {cfg.sft_lookup_steps}"
        )
    if cfg.rl_eval_steps < 0:
        raise UsageError(f"rl_eval_steps must be >= 0 (0: no evaluation during RL), got {cfg.rl_eval_steps}")
    for name in positive:
        if getattr(cfg, name) < 1:
            raise UsageError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.rl_batch_size % cfg.rl_num_generations:
        raise UsageError(
            f"rl_batch_size {cfg.rl_batch_size} must be a multiple of rl_num_generations {cfg.rl_num_generations}"
        )
    if rl_steps_of(cfg) < len(rl_stages_of(cfg)):
        raise UsageError(
            f"rl_steps {rl_steps_of(cfg)}: the curriculum needs at least one step per stage {rl_stages_of(cfg)}"
        )
    check_data_settings(cfg)
