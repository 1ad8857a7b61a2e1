"""``make reproduce``: the demo pipeline for several seeds, pooled held-out evaluation and paired comparisons.

Each seed runs the whole method (:func:`reflect_trl.pipelines.demo.run_demo`): the tiny models' initialisation, the generated
data, SFT, RL sampling and the evaluation tasks all change with the seed. The results of every seed are then pooled
(:mod:`reflect_trl.pipelines.statistics` says how):

* **rows** -- one per (configuration, stage, decoding): the pooled successes / episodes with a 95 % bootstrap interval
  over training seeds and problem instances, the success rate of every seed, and -- where the seeds' training
  instances are known -- ``seen_share`` (the share of the `test` episodes whose problem instance some SFT or RL task
  of the same seed posed: the splits hold out *task seeds*, and an environment with few instances, like
  DangerousTaxi's `dropoff` with 12 start states, repeats training instances) and ``unseen`` (the success on the
  other episodes, with its own interval);
* **comparisons** -- for the pairs worth stating (Reflect-RL against every other row, ...) and every stage, the
  difference of the pooled success rates a - b with a 95 % interval from a **paired bootstrap** (within one seed every
  configuration plays the same tasks with the same episode seeds, so the per-episode outcomes are paired): each
  replicate resamples the seeds and the problem instances (crossed with the seeds where instances repeat across
  seeds), each instance with all its episodes. Beside it, a **t interval over the per-seed differences** (with five
  seeds a percentile bootstrap under-covers), the per-seed differences themselves, and the same comparison on the
  unseen instances (``unseen``). A claim should hold under both intervals, on every seed, on unseen instances, and on
  another set of seeds.

Outputs under ``outputs/reproduce/<env>-<protocol>/``: ``summary.json`` (seeds, rows, comparisons, per-seed timings), ``results.md``
(the configuration x stage table, the comparisons, per-seed spread, wall times, the machine), ``success_by_seed.png``
(pooled bars with every seed's rate as a dot), ``learning_curves.png`` (every seed's RL curves) and, with
``--rl_eval_steps``, ``eval_curves.png`` (every seed's greedy `validation` curves during RL), plus one
``seed_<s>/`` directory per seed with the demo's own outputs.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from reflect_trl.pipelines.protocols import configuration_rows, rl_steps_of
from reflect_trl.pipelines.statistics import (
    attach_unseen,
    compare,
    compare_naming_rates,
    pool_rows,
    restrict_to_unseen,
    training_instances,
)

#: Pairs also compared across decodings: a under each decoding against b under b's best decoding (per stage).
VERSUS_BEST: tuple[tuple[str, str], ...] = (
    ("Reflect-RL", "Reflect SFT (before RL)"),
    ("Reflect-RL, reflections sampled in RL", "Reflect SFT (before RL)"),
    ("Reflect-RL, both players learn", "Reflect SFT (before RL)"),
    ("Reflect-RL, both learn (verified reward)", "Reflect SFT (before RL)"),
    ("Reflect-RL, both learn (mixed reward)", "Reflect SFT (before RL)"),
)

#: Pairs against a scripted reference row with one decoding (statistics.compare's ``versus_reference``): does the
#: trained pair beat a uniformly random legal action (the environments where random play succeeds, TextWorld)?
VERSUS_REFERENCE: tuple[tuple[str, str], ...] = (
    ("Reflect SFT (before RL)", "random policy"),
    ("Reflect-RL", "random policy"),
    ("SFT only", "random policy"),
)

#: The reflection player's own reward (ReflectPPOConfig.reflection_reward), its arms and its controls.
REFLECTION_REWARD_COMPARISONS: tuple[tuple[str, str], ...] = (
    ("Reflect-RL, both learn (verified reward)", "Reflect SFT (before RL)"),
    ("Reflect-RL, both learn (mixed reward)", "Reflect SFT (before RL)"),
    ("Reflect-RL, only the reflection learns (verified reward)", "Reflect SFT (before RL)"),
    ("Reflect-RL, both learn (verified reward)", "Reflect-RL, both players learn"),
    ("Reflect-RL, both learn (verified reward)", "Reflect-RL"),
    # a better signal, or more oracle labels / on-policy states? (the controls share the Reflect SFT policy)
    (
        "Reflect-RL, only the reflection learns (verified reward)",
        "Reflection: on-policy oracle SFT (control)",
    ),
    (
        "Reflect-RL, only the reflection learns (verified reward)",
        "Reflection: SFT continued, label-matched (control)",
    ),
    ("Reflect-RL, both learn (verified reward)", "Reflection: on-policy oracle SFT (control)"),
    ("Reflect-RL, both learn (verified reward)", "Reflection: SFT continued, label-matched (control)"),
    ("Reflection: on-policy oracle SFT (control)", "Reflect SFT (before RL)"),
    ("Reflection: SFT continued, label-matched (control)", "Reflect SFT (before RL)"),
)

#: Pairs stated in ``comparisons``: (a, b) means "a minus b".
COMPARISONS: tuple[tuple[str, str], ...] = (
    ("Reflect-RL", "Reflect SFT (before RL)"),
    ("Reflect-RL", "SFT + RL w/o reflection"),
    ("Reflect-RL", "SFT only"),
    ("Reflect-RL", "Reflect-RL w/o negative examples"),
    ("Reflect-RL", "Reflect-RL w/o curriculum"),
    ("Reflect SFT (before RL)", "SFT only"),  # reflection without RL
    ("Reflect SFT (before RL)", "Reflect SFT w/o negative examples"),  # negative examples without RL
    # design D1 (frozen player, reflections sampled in RL) and the players that learn
    ("Reflect-RL, reflections sampled in RL", "Reflect SFT (before RL)"),
    ("Reflect-RL, both players learn", "Reflect-RL, reflections sampled in RL"),
    ("Reflect-RL, only the reflection learns", "Reflect-RL, reflections sampled in RL"),
    ("Reflect-RL, both players learn", "Reflect SFT (before RL)"),
    # design D3: RL against as many more SFT steps on the same demonstrations
    ("Reflect-RL", "Reflect SFT, continued"),
    ("Reflect SFT, continued", "Reflect SFT (before RL)"),
    # the `paper` protocol: its SFT start against the behaviour that generated its data
    ("Reflect SFT (before RL)", "oracle + random (the data's behaviour, no training)"),
    # RL against the ceiling of copying its reflection (scripted_actors.ReflectionFollowerActor)
    ("Reflect-RL", "follows its reflection (no policy training)"),
    *REFLECTION_REWARD_COMPARISONS,
)

#: Pairs whose closed-loop optimal-naming rates are compared (``reflection_naming`` of summary.json): does a learning
#: reflection name optimal moves more often than the SFT'd one?
NAMING_COMPARISONS: tuple[tuple[str, str], ...] = (
    ("Reflect-RL, both players learn", "Reflect SFT (before RL)"),
    ("Reflect-RL, only the reflection learns", "Reflect SFT (before RL)"),
    *REFLECTION_REWARD_COMPARISONS,
)


# ------------------------------------------------------------------------------------------------- the command
@dataclass
class ReproduceConfig:
    """What ``reflect-trl reproduce`` runs. ``demo_overrides`` are :class:`~reflect_trl.pipelines.demo.DemoConfig` fields
    applied to every seed (``--rl_steps 120``); ``jobs``: worker processes of the pool shared by all seeds' jobs
    (0: the demo's ``jobs``)."""

    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    env_name: str = "taxi"
    output_dir: str | None = None  # default outputs/reproduce/<env>-<protocol>
    smoke: bool = False
    bootstrap_resamples: int = 10_000
    jobs: int = 0
    rerun: bool = False  # False: a seed whose finished run has the same demo configuration is reused
    demo_overrides: dict[str, Any] = field(default_factory=dict)
    command: str | None = None  # the command line that ran it (summary.json, the README's blocks)

    @property
    def protocol(self) -> str:
        return str(self.demo_overrides.get("protocol", "strict"))

    @property
    def out(self) -> Path:
        return Path(self.output_dir or f"outputs/reproduce/{self.env_name}-{self.protocol}")

    def demo_config(self, seed: int):
        """The demo configuration of one seed (validated by :func:`reflect_trl.pipelines.demo.check_demo_config`)."""
        from reflect_trl.pipelines.demo import DemoConfig
        from reflect_trl.pipelines.protocols import env_demo_settings

        seed_dir = str(self.out / f"seed_{seed}")
        base = DemoConfig.smoke(seed_dir) if self.smoke else DemoConfig(output_dir=seed_dir)
        settings: dict[str, Any] = {"seed": seed, "env_name": self.env_name}
        settings.update(env_demo_settings(self.env_name, smoke=self.smoke))
        settings.update(self.demo_overrides)
        return replace(base, **settings)


def _machine() -> dict[str, Any]:
    import torch

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }


def finished_summary(cfg: Any) -> dict[str, Any] | None:
    """The ``summary.json`` of a finished demo run in ``cfg.output_dir`` whose ``demo_config.json`` equals ``cfg``
    (every field: seed, steps, data, evaluation) and whose rows and RL steps are what ``cfg`` resolves to now (a field
    left to the protocol, such as ``configurations`` or ``rl_steps``, follows the code); ``None`` when there is none,
    anything differs or the run predates a field."""
    seed_dir = Path(cfg.output_dir)
    try:
        recorded = json.loads((seed_dir / "demo_config.json").read_text())
        summary = json.loads((seed_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    current = json.loads(json.dumps(asdict(cfg)))
    # a field added since the run is a difference: its default need not be what the run did then
    if {k: recorded.get(k) for k in current} != current or "results" not in summary:
        return None
    rows = {row.label for row in configuration_rows(cfg)}
    if (
        summary.get("rl_steps") != rl_steps_of(cfg)
        or {r.get("configuration") for r in summary["results"]} != rows
    ):
        return None
    return summary


def _run_seeds(config: ReproduceConfig, demo_configs: dict[int, Any]) -> dict[int, dict[str, Any]]:
    """Run every seed's demo (:func:`_run_demos`); a seed already finished with the same configuration is reused
    unless ``config.rerun``."""
    reused: dict[int, dict[str, Any]] = {}
    if not config.rerun:
        for seed, cfg in demo_configs.items():
            if (summary := finished_summary(cfg)) is not None:
                reused[seed] = {**summary, "reused": True}
                print(
                    f"[reproduce] seed {seed}: reusing the finished run in {cfg.output_dir} (--rerun to redo it)"
                )
    fresh = _run_demos(config, {seed: cfg for seed, cfg in demo_configs.items() if seed not in reused})
    return {seed: reused[seed] if seed in reused else fresh[seed] for seed in demo_configs}


def _run_demos(config: ReproduceConfig, demo_configs: dict[int, Any]) -> dict[int, dict[str, Any]]:
    """Every seed's demo in one shared pool of ``config.jobs`` worker processes (:func:`reflect_trl.pipelines.jobs.run_jobs`):
    models and data are built here, then all seeds' SFT / relabel / RL jobs, their evaluation jobs (one per
    configuration, :func:`reflect_trl.pipelines.demo.evaluation_jobs`) and each seed's summary (``reflect-trl demo
    --evaluate_only``, which finds every evaluation recorded) go into one job graph, seed by seed in list order, so a
    seed's last long job overlaps the next seed's first ones instead of leaving a core idle. Logs:
    ``seed_<s>/logs/`` (evaluations: ``seed_<s>/eval/workers/``). With
    ``reflection_backend: openai`` (the demo starts its own server) the seeds run one after the other, one
    ``reflect-trl demo`` process each. Returns each seed's ``summary.json``."""
    if not demo_configs:  # every seed reused: nothing to run, only the pooling
        return {}
    from reflect_trl.pipelines.demo import (
        JOB_TIMINGS,
        demo_eval_settings,
        demo_jobs,
        evaluation_jobs,
        job_label,
        prepare_demo,
    )
    from reflect_trl.pipelines.demo import _Progress as Progress
    from reflect_trl.pipelines.jobs import Job, run_jobs

    start = time.perf_counter()

    def say(message: str) -> None:
        print(f"[reproduce {(time.perf_counter() - start) / 60:5.1f} min] {message}", flush=True)

    jobs: list[Job] = []
    seed_of: dict[str, int] = {}
    recorded: dict[int, dict[str, Any]] = {}
    for seed, cfg in demo_configs.items():
        seed_dir = Path(cfg.output_dir)
        seed_dir.mkdir(parents=True, exist_ok=True)
        request = seed_dir / "demo_request.json"
        request.write_text(json.dumps(asdict(cfg), indent=2) + "\n")
        if cfg.reflection_backend == "openai":
            jobs.append(Job(f"seed {seed}", "demo", ["--config", str(request)], log=seed_dir / "demo.log"))
            seed_of[jobs[-1].name] = seed
            continue
        progress = Progress()
        (seed_dir / JOB_TIMINGS).unlink(missing_ok=True)
        base, data = prepare_demo(cfg, progress)
        recorded[seed] = {"timings_seconds": dict(progress.timings)}
        seed_jobs = demo_jobs(cfg, base, data, seed_dir / "runs")
        seed_jobs += evaluation_jobs(cfg, seed_jobs, demo_eval_settings(cfg), reuse=not config.rerun)
        named = {job.name: f"seed {seed} {job_label(job)} {job.name}" for job in seed_jobs}
        for job in seed_jobs:
            needs = tuple(named[n] for n in job.needs)
            # an evaluation job keeps its own log (eval/workers/)
            log = job.log or seed_dir / "logs" / f"{job.name}.log"
            jobs.append(replace(job, name=named[job.name], needs=needs, log=log))
        evaluation = f"seed {seed} evaluation"
        log = seed_dir / "logs" / "evaluation.log"
        argv = ["--config", str(request), "--evaluate_only"]
        jobs.append(Job(evaluation, "demo", argv, tuple(named.values()), log=log))
        seed_of.update(dict.fromkeys([*named.values(), evaluation], seed))

    log_of = {job.name: job.log for job in jobs}

    def report(name: str, event: str, seconds: float) -> None:
        seed = seed_of[name]
        if event == "reused":
            say(f"{name} reused (finished before with the same command line; --rerun to redo it)")
            return
        if event == "start":
            if seed in recorded:  # a seed's wall time runs from its first job (it may overlap other seeds')
                recorded[seed].setdefault("start_time", time.time())
            say(f"{name} started (log {log_of[name]})")
            return
        say(f"{name} done after {seconds / 60:.1f} min")
        if seed in recorded and not name.endswith(" evaluation"):
            step = name.removeprefix(f"seed {seed} ")
            recorded[seed]["timings_seconds"][step] = seconds
            # the seed's evaluation job reads these when it writes the seed's summary
            path = Path(demo_configs[seed].output_dir) / JOB_TIMINGS
            path.write_text(json.dumps(recorded[seed], indent=2) + "\n")

    workers = config.jobs or max(cfg.jobs for cfg in demo_configs.values())
    if any(cfg.reflection_backend == "openai" for cfg in demo_configs.values()):
        workers = 1  # each seed's demo runs its own server and its own pool
    run_jobs(jobs, workers=workers, report=report, reuse=not config.rerun)
    return {
        seed: json.loads((Path(cfg.output_dir) / "summary.json").read_text())
        for seed, cfg in demo_configs.items()
    }


def with_instances(results: Sequence[Mapping[str, Any]], cfg: Any) -> list[dict[str, Any]]:
    """The results of one seed, each with the problem instance of every episode (``instances``): a run evaluated
    before the evaluation recorded them gets them from its demo configuration (the held-out tasks are a function of
    it)."""
    from reflect_trl.evaluation import eval_tasks, instance_keys
    from reflect_trl.pipelines.demo import demo_eval_settings

    settings = demo_eval_settings(cfg)
    out = []
    for r in results:
        r = dict(r)
        if not r.get("instances"):
            tasks, _ = eval_tasks(settings, r["stage"])
            if len(tasks) != len(r["outcomes"]):
                raise ValueError(
                    f"{cfg.output_dir}: {r['configuration']} / {r['stage']} has {len(r['outcomes'])} outcomes but its "
                    f"configuration gives {len(tasks)} held-out tasks"
                )
            r["instances"] = instance_keys(settings, tasks)
        out.append(r)
    return out


def run_reproduce(config: ReproduceConfig) -> dict[str, Any]:
    from reflect_trl.pipelines.demo import check_demo_config

    demo_configs = {seed: config.demo_config(seed) for seed in config.seeds}
    for cfg in demo_configs.values():
        check_demo_config(cfg)  # every seed's settings are checked before anything is written
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    per_seed_summary = _run_seeds(config, demo_configs)
    per_seed_results = {
        seed: with_instances(s["results"], demo_configs[seed]) for seed, s in per_seed_summary.items()
    }
    decodings = list(dict.fromkeys(r["decoding"] for rs in per_seed_results.values() for r in rs))
    first = demo_configs[config.seeds[0]]
    training = {seed: training_instances(c) for seed, c in demo_configs.items()}
    held_out = f"all {first.eval_split} episodes"
    if first.rl_tasks == "disjoint":  # design D3: compare on the instances neither SFT nor RL trained on
        per_seed_results = restrict_to_unseen(per_seed_results, training)
        held_out = (
            f"{first.eval_split} episodes whose instance no training task of the seed posed (SFT or RL)"
        )
    resamples = config.bootstrap_resamples
    rows = pool_rows(per_seed_results, training, min(resamples, 2_000))
    comparisons = compare(per_seed_results, COMPARISONS, decodings, resamples, VERSUS_BEST, VERSUS_REFERENCE)
    unseen_results = restrict_to_unseen(per_seed_results, training)
    attach_unseen(
        rows,
        comparisons,
        pool_rows(unseen_results, None, min(resamples, 2_000)),
        compare(unseen_results, COMPARISONS, decodings, resamples, VERSUS_BEST, VERSUS_REFERENCE),
    )
    summary = {
        "protocol": first.protocol,
        "rl_steps": rl_steps_of(first),  # resolved: the demo config keeps None for "the protocol's own"
        "env_name": config.env_name,
        "seeds": list(config.seeds),
        "command": config.command,
        "split": first.eval_split,
        "held_out": held_out,
        "rows": rows,
        "comparisons": comparisons,
        "reflection_naming": compare_naming_rates(per_seed_results, NAMING_COMPARISONS, decodings),
        "per_seed": {
            str(seed): {
                "total_seconds": s["total_seconds"],
                "reused": bool(s.get("reused")),  # finished by an earlier call with the same configuration
                "timings_seconds": s["timings_seconds"],
                "sft_metrics": s.get("sft_metrics", {}),
            }
            for seed, s in per_seed_summary.items()
        },
        "demo_config": {k: v for k, v in asdict(first).items() if k not in ("output_dir", "seed")},
        "jobs": config.jobs or first.jobs,
        "total_seconds": time.perf_counter() - start,
        "machine": _machine(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plots = write_plots(summary, out)
    (out / "results.md").write_text(results_markdown(summary, plots))
    print(f"\n[reproduce] {len(config.seeds)} seeds in {summary['total_seconds'] / 60:.1f} min -> {out}")
    print(results_table(summary["rows"], decodings[0]))
    return summary


def write_plots(summary: Mapping[str, Any], out: Path) -> list[Path]:
    from reflect_trl.pipelines.plotting import (
        load_log_history,
        plot_eval_curves_if_logged,
        plot_learning_curves,
        plot_seed_bars,
    )

    plots = []
    for decoding in dict.fromkeys(r["decoding"] for r in summary["rows"]):
        plots.append(
            plot_seed_bars(
                summary["rows"], summary["seeds"], out / f"success_by_seed_{decoding}.png", decoding
            )
        )
    curves = {}
    for seed in summary["seeds"]:
        for run in ("rl_reflect", "rl_plain"):
            run_dir = out / f"seed_{seed}" / "runs" / run
            if (run_dir / "log_history.json").is_file():
                curves[f"{run} seed {seed}"] = load_log_history(run_dir)
    if curves:
        plots.append(plot_learning_curves(curves, out / "learning_curves.png"))
    # rl_eval_steps > 0: the greedy validation curves of every seed's RL runs, coloured as in learning_curves.png
    plots += plot_eval_curves_if_logged(curves, out / "eval_curves.png")
    return plots


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _stage_grid(chosen: Sequence[Mapping[str, Any]], cell: Callable[[Mapping[str, Any]], str]) -> str:
    """Markdown: one line per configuration, one column per stage, ``cell(row)`` in each ("" where no row)."""
    stages = list(dict.fromkeys(r["stage"] for r in chosen))
    by_key = {(r["configuration"], r["stage"]): r for r in chosen}
    lines = ["| configuration | " + " | ".join(stages) + " |", "|---|" + "---|" * len(stages)]
    for conf in dict.fromkeys(r["configuration"] for r in chosen):
        cells = [cell(by_key[conf, stage]) if (conf, stage) in by_key else "" for stage in stages]
        lines.append(f"| {conf} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def results_table(rows: Sequence[Mapping[str, Any]], decoding: str) -> str:
    """Markdown: configurations x stages, pooled success [95 % bootstrap over seeds and instances] and the per-seed rates ("–": a
    seed with no episode in the row)."""

    def cell(r: Mapping[str, Any]) -> str:
        seeds = " / ".join("–" if p is None else f"{100 * p:.0f}" for p in r["per_seed"])
        return f"{_pct(r['success_rate'])} % [{_pct(r['ci_low'])}, {_pct(r['ci_high'])}] ({seeds})"

    return _stage_grid([r for r in rows if r["decoding"] == decoding], cell)


def exposure_table(rows: Sequence[Mapping[str, Any]], decoding: str) -> str:
    """Markdown: configurations x stages, the success on unseen instances [95 % interval] (distinct instances) and
    the share of the row's episodes on instances a training task of the seed posed ("" without the split)."""
    chosen = [r for r in rows if r["decoding"] == decoding and "seen" in r]
    if not chosen:
        return ""

    def cell(r: Mapping[str, Any]) -> str:
        unseen, share = r["unseen"], r.get("seen_share")
        seen = f"; {100 * share:.0f} % seen" if share is not None else ""
        if unseen["success_rate"] is None:
            return f"– (0 instances){seen}"
        interval = f" [{_pct(unseen['ci_low'])}, {_pct(unseen['ci_high'])}]" if "ci_low" in unseen else ""
        return f"{_pct(unseen['success_rate'])} %{interval} ({unseen['instances']} instances){seen}"

    return _stage_grid(chosen, cell)


def naming_table(naming: Sequence[Mapping[str, Any]], decoding: str) -> str:
    """Markdown: the optimal-naming rate comparisons of ``decoding`` (empty when there are none)."""
    lines = [
        "| a | b | stage | rate a | rate b | a − b (95% t interval) | per seed |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in naming:
        if c["decoding"] != decoding:
            continue
        interval = "–" if c["t_low"] is None else f"[{100 * c['t_low']:+.1f}, {100 * c['t_high']:+.1f}]"
        per_seed = ", ".join(f"{100 * d:+.1f}" for d in c["per_seed_diff"])
        lines.append(
            f"| {c['a']} | {c['b']} | {c['stage']} | {100 * c['rate_a']:.1f} | {100 * c['rate_b']:.1f} | "
            f"{100 * c['diff']:+.1f} {interval} | {per_seed} |"
        )
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def comparisons_table(comparisons: Sequence[Mapping[str, Any]], decoding: str) -> str:
    """Markdown: the comparisons of ``decoding`` (b under another decoding named where it differs): the difference
    with its bootstrap and t intervals, per seed, and on unseen instances."""
    lines = [
        "| a − b | stage | difference [95 % bootstrap] | t over seeds | per seed | seeds agree | unseen instances |",
        "|---|---|---|---|---|---|---|",
    ]

    def t(c: Mapping[str, Any]) -> str:
        return "–" if c.get("t_low") is None else f"[{100 * c['t_low']:+.1f}, {100 * c['t_high']:+.1f}]"

    for c in comparisons:
        if c["decoding"] != decoding:
            continue
        per_seed = " / ".join("–" if d is None else f"{100 * d:+.0f}" for d in c["per_seed_diff"])
        b = c["b"] if c.get("decoding_b", decoding) == decoding else f"{c['b']} ({c['decoding_b']}, its best)"
        u = c.get("unseen")
        unseen = (
            "–"
            if u is None
            else f"{100 * u['diff']:+.1f} [{100 * u['ci_low']:+.1f}, {100 * u['ci_high']:+.1f}], t {t(u)}"
        )
        lines.append(
            f"| {c['a']} − {b} | {c['stage']} | {100 * c['diff']:+.1f} pts "
            f"[{100 * c['ci_low']:+.1f}, {100 * c['ci_high']:+.1f}] | {t(c)} | {per_seed} | "
            f"{'yes' if c.get('seeds_agree', True) else 'no'} | {unseen} |"
        )
    return "\n".join(lines) + "\n"


def diagnostics_table(rows: Sequence[Mapping[str, Any]], decoding: str) -> str:
    """Markdown: the pooled reflection diagnostics of the configurations with a reflection (``""`` without)."""
    chosen = [r for r in rows if r["decoding"] == decoding and r.get("diagnostics", {}).get("known")]
    if not chosen:
        return ""

    def rate(d: Mapping[str, Any], num: str, den: str) -> str:
        return f"{100 * d[num] / d[den]:.1f}" if d.get(den) else "–"

    lines = [
        "| configuration | stage | reflection names an optimal move | follows the reflection | deviates from a wrong "
        "one | deviates from a right one | crashes on a wrongly named move |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in chosen:
        d = r["diagnostics"]
        lines.append(
            f"| {r['configuration']} | {r['stage']} | {rate(d, 'named_right', 'known')} % | "
            f"{rate(d, 'followed', 'named')} % | {rate(d, 'deviated_from_wrong', 'named_wrong')} % | "
            f"{rate(d, 'deviated_from_right', 'named_right')} % | {d['crashes_on_named_wrong']} of {d['crashes']} |"
        )
    return "\n".join(lines) + "\n"


def results_markdown(summary: Mapping[str, Any], plots: Sequence[Path] = ()) -> str:
    seeds = summary["seeds"]
    rows = summary["rows"]
    episodes = {r["episodes"] for r in rows}
    split = summary.get("split") or summary.get("demo_config", {}).get("eval_split", "test")
    parts = [
        f"# reflect-trl reproduce: {summary['env_name']}, protocol `{summary.get('protocol', 'strict')}`"
        + (f" ({summary['rl_steps']} RL steps)" if summary.get("rl_steps") else "")
        + f", seeds {', '.join(map(str, seeds))}\n",
        f"Held-out `{split}` episodes pooled over {len(seeds)} seeds ({', '.join(map(str, sorted(episodes)))} per "
        f"cell; {summary.get('held_out', f'all {split} episodes')}); success rate with a 95 % interval from a "
        "bootstrap over the training seeds and the distinct problem instances, then each seed's rate in "
        "parentheses.\n",
    ]
    stage_instances = {r["stage"]: (r.get("instances", r["episodes"]), r["episodes"]) for r in rows}
    repeated = [f"`{stage}` {n} of {m}" for stage, (n, m) in stage_instances.items() if n < m]
    if repeated:
        parts.append(
            f"Distinct instances (summed over seeds) of the episodes per cell: {', '.join(repeated)}.\n"
        )
    for decoding in dict.fromkeys(r["decoding"] for r in rows):
        parts += [f"## {decoding} decoding\n", results_table(rows, decoding)]
        parts += [
            "Differences of pooled success rates: a paired bootstrap over seeds and instances (instances crossed "
            "with seeds where they repeat across seeds) and a t interval over the per-seed differences, both 95 %; "
            "'seeds agree' is no when the per-seed differences change sign; the last column is the same comparison "
            "on the instances no training task of the seed posed:\n",
            comparisons_table(summary["comparisons"], decoding),
        ]
        naming = naming_table(summary.get("reflection_naming") or [], decoding)
        if naming:
            parts += [
                "Closed-loop rate at which the reflections name an optimal move (pooled over the seeds' turns), a "
                "minus b, with a t interval (95 %) over the per-seed differences:\n",
                naming,
            ]
        diagnostics = diagnostics_table(rows, decoding)
        if diagnostics:
            parts += [
                "Reflection diagnostics over all turns (pooled counts): how often the reflection names an optimal "
                "move (closed loop), how often the policy follows it, deviates from a wrong / a right one, and the "
                "crashes on a wrongly named move that the policy followed:\n",
                diagnostics,
            ]
        exposure = exposure_table(rows, decoding)
        if exposure:
            parts += [
                "Success on the unseen instances (no SFT or RL task of the seed posed them) and the share of the "
                "row's episodes on seen ones. The splits hold out task seeds, not instances; an environment with few "
                "instances repeats training instances in its evaluation split.\n",
                exposure,
            ]
    step_names = _step_names(summary)
    timing_lines = ["| seed | wall time | " + " | ".join(n.split(":")[0] for n in step_names) + " |"]
    timing_lines.append("|---|---|" + "---|" * len(step_names))
    for seed in seeds:
        info = summary["per_seed"][str(seed)]
        seconds = [info["timings_seconds"].get(n) for n in step_names]
        steps = " | ".join("–" if v is None else f"{v:.0f} s" for v in seconds)
        reused = " (reused)" if info.get("reused") else ""
        timing_lines.append(f"| {seed} | {info['total_seconds'] / 60:.1f} min{reused} | {steps} |")
    machine = summary["machine"]
    reused_seeds = [seed for seed in seeds if summary["per_seed"][str(seed)].get("reused")]
    seed_minutes = sum(summary["per_seed"][str(seed)]["total_seconds"] for seed in seeds) / 60
    parts += [
        "## Wall time\n",
        "\n".join(timing_lines) + "\n",
        f"Job wall times; a seed's wall time runs from its first step to its evaluation, and the seeds' spans "
        f"overlap in the pool of {summary.get('jobs', 1)} worker processes that all seeds' jobs share "
        f"({seed_minutes:.1f} min summed). This call: {summary['total_seconds'] / 60:.1f} min"
        + (f" (seeds {', '.join(map(str, reused_seeds))} reused from earlier calls)" if reused_seeds else "")
        + f", on {machine['cpu_count']} CPU cores ({machine['processor']}, "
        f"{machine['platform']}), Python {machine['python']}, torch {machine['torch']}"
        f" ({machine['torch_threads']} threads){', CUDA' if machine['cuda'] else ''}.\n",
    ]
    if plots:
        parts.append("Plots: " + ", ".join(f"`{Path(p).name}`" for p in plots) + "\n")
    return "\n".join(parts)


def _step_names(summary: Mapping[str, Any]) -> list[str]:
    """Every seed's timed steps, in the first seed's order (seeds finish their jobs in different orders)."""
    names: dict[str, None] = {}
    for seed in summary["seeds"]:
        names.update(dict.fromkeys(summary["per_seed"][str(seed)]["timings_seconds"]))
    return list(names)


__all__ = [
    "COMPARISONS",
    "VERSUS_REFERENCE",
    "ReproduceConfig",
    "run_reproduce",
]
