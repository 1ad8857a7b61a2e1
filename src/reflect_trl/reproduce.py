"""``make reproduce``: the demo pipeline for several seeds, pooled held-out evaluation and paired comparisons.

Each seed runs the whole method (:func:`reflect_trl.demo.run_demo`): the tiny models' initialisation, the generated
data, SFT, RL sampling and the held-out evaluation tasks all change with the seed. The results of every seed are
then pooled:

* **rows** -- one per (configuration, stage, decoding): the pooled successes / episodes with a 95 % Wilson interval
  (over distinct instances, see below), and the success rate of every seed;
* **comparisons** -- for the pairs worth stating (Reflect-RL against every other row) and every stage, the difference
  of the pooled success rates with a 95 % interval from a **paired bootstrap over problem instances, stratified by
  seed**: within one seed every configuration plays the same tasks with the same episode seeds, so the per-task
  outcomes of two configurations are paired; each bootstrap replicate resamples the distinct instances of every seed
  (``TextEnv.instance_key``: held-out tasks can repeat an instance, e.g. DangerousTaxi's ``dropoff`` stage has 12 start
  states) with replacement, each with all its episodes (the seeds themselves are kept), and recomputes the pooled
  difference; the interval is the 2.5 / 97.5 percentiles. The rows' Wilson intervals likewise count distinct
  instances, not episodes. The per-seed differences are listed too: an interval over instances says nothing about
  another training seed, so a claim should also hold on every seed.

Outputs under ``outputs/reproduce/<env>/``: ``summary.json`` (seeds, rows, comparisons, per-seed timings), ``results.md``
(the configuration x stage table, the comparisons, per-seed spread, wall times, the machine), ``success_by_seed.png``
(pooled bars with every seed's rate as a dot), ``learning_curves.png`` (every seed's RL curves) and, with
``--rl_eval_steps``, ``eval_curves.png`` (every seed's greedy `validation` curves during RL), plus one
``seed_<s>/`` directory per seed with the demo's own outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from reflect_trl.evaluation import instance_interval

#: Pairs stated in ``comparisons``: (a, b) means "a minus b".
COMPARISONS: tuple[tuple[str, str], ...] = (
    ("Reflect-RL", "Reflect SFT (before RL)"),
    ("Reflect-RL", "SFT + RL w/o reflection"),
    ("Reflect-RL", "SFT only"),
    ("Reflect-RL", "Reflect-RL w/o negative examples"),
    ("Reflect-RL", "Reflect-RL w/o curriculum"),
)


# ------------------------------------------------------------------------------------------------- statistics
def _outcomes_by_exposure(
    cells: Sequence[Mapping[str, Any]], seen: Sequence[set[str] | None]
) -> dict[str, dict[str, Any]] | None:
    """The outcomes of one row's cells (one per seed) split by whether the episode's instance was also among that
    seed's training tasks (``seen[i]``: the training instance keys of cell i's seed and stage)."""
    if any(s is None or not c.get("instances") for c, s in zip(cells, seen, strict=True)):
        return None
    out = {}
    for part, wanted in (("seen", True), ("unseen", False)):
        successes = episodes = instances = 0
        for cell, keys in zip(cells, seen, strict=True):
            chosen = [
                (k, o)
                for k, o in zip(cell["instances"], cell["outcomes"], strict=True)
                if (k in keys) == wanted
            ]
            successes += sum(bool(o) for _, o in chosen)
            episodes += len(chosen)
            instances += len({k for k, _ in chosen})
        out[part] = {
            "successes": successes,
            "episodes": episodes,
            "instances": instances,
            "success_rate": successes / episodes if episodes else None,
        }
    return out


def pool_rows(
    per_seed: Mapping[int, Sequence[Mapping[str, Any]]],
    training: Mapping[int, Mapping[str, set[str]]] | None = None,
) -> list[dict[str, Any]]:
    """Pool the evaluation results of several seeds: one row per (configuration, stage, decoding).

    With ``training`` (seed -> stage -> instance keys of that seed's training tasks), each row also gets ``seen`` /
    ``unseen``: its held-out episodes whose problem instance was / was not among the training tasks (an environment
    with few instances, like DangerousTaxi, repeats training instances in its held-out split)."""
    seeds = sorted(per_seed)
    keys: dict[tuple[str, str, str], None] = {}
    for seed in seeds:
        for r in per_seed[seed]:
            keys[(r["configuration"], r["stage"], r["decoding"])] = None
    rows = []
    for configuration, stage, decoding in keys:
        cells = []
        for seed in seeds:
            match = [
                r
                for r in per_seed[seed]
                if (r["configuration"], r["stage"], r["decoding"]) == (configuration, stage, decoding)
            ]
            if len(match) != 1:
                raise ValueError(
                    f"seed {seed}: expected one result for {configuration!r} / {stage} / {decoding}, got {len(match)}"
                )
            cells.append(match[0])
        successes = sum(int(c["successes"]) for c in cells)
        episodes = sum(int(c["episodes"]) for c in cells)
        # distinct instances per seed (one instance under two seeds' models is two observations)
        instances = sum(len(set(c.get("instances") or [])) or int(c["episodes"]) for c in cells)
        rate = successes / episodes if episodes else 0.0
        low, high = instance_interval(rate, instances)
        rows.append(
            {
                "configuration": configuration,
                "stage": stage,
                "decoding": decoding,
                "successes": successes,
                "episodes": episodes,
                "instances": instances,
                "success_rate": rate,
                "ci_low": low,
                "ci_high": high,
                "per_seed": [c["success_rate"] for c in cells],
                "per_seed_successes": [int(c["successes"]) for c in cells],
                "per_seed_episodes": [int(c["episodes"]) for c in cells],
            }
        )
        if training is not None:
            exposure = _outcomes_by_exposure(cells, [training.get(seed, {}).get(stage) for seed in seeds])
            if exposure is not None:
                rows[-1].update(exposure)
    return rows


def training_instances(cfg: Any) -> dict[str, set[str]]:
    """Stage -> instance keys of the training tasks of a demo run (its SFT data and its RL tasks)."""
    from reflect_trl.demo import rl_train_tasks
    from reflect_trl.envs import make_env

    env = make_env(cfg.env_name, **dict(cfg.env_kwargs))
    counts = {
        cfg.n_train_tasks,
        rl_train_tasks(cfg),
    }  # the SFT data's tasks, the RL tasks (one call when equal)
    return {
        stage: {
            env.instance_key(t)
            for n in counts
            for t in env.make_tasks("train", n, seed=cfg.seed, difficulty=stage)
        }
        for stage in env.stages
    }


def paired_bootstrap_difference(
    outcomes_a: Sequence[Sequence[int]],
    outcomes_b: Sequence[Sequence[int]],
    resamples: int = 10_000,
    seed: int = 0,
    instances: Sequence[Sequence[str]] | None = None,
) -> tuple[float, float, float]:
    """Pooled success-rate difference a - b and its 95 % percentile interval.

    ``outcomes_x[s][i]`` is 1 if configuration x succeeded on task i of seed s (both configurations played the same
    tasks). ``instances[s][i]`` is the problem instance of that task (None: every task its own). Each replicate
    resamples the instances of every seed with replacement, each with all its tasks, keeping the pairs together."""
    if len(outcomes_a) != len(outcomes_b):
        raise ValueError("outcomes_a and outcomes_b must have one list per seed")
    diffs_per_seed = []
    for s, (a, b) in enumerate(zip(outcomes_a, outcomes_b, strict=True)):
        if len(a) != len(b):
            raise ValueError(
                f"seed index {s}: {len(a)} vs {len(b)} outcomes; the configurations must share tasks"
            )
        keys = list(instances[s]) if instances is not None else list(range(len(a)))
        if len(keys) != len(a):
            raise ValueError(f"seed index {s}: {len(keys)} instance keys for {len(a)} outcomes")
        clusters: dict[Any, list[int]] = {}  # instance -> [sum of differences, number of tasks]
        for key, x, y in zip(keys, a, b, strict=True):
            cell = clusters.setdefault(key, [0, 0])
            cell[0] += x - y
            cell[1] += 1
        diffs_per_seed.append(list(clusters.values()))
    total = sum(n for d in diffs_per_seed for _, n in d)
    if total == 0:
        raise ValueError("no outcomes to compare")
    point = sum(diff for d in diffs_per_seed for diff, _ in d) / total
    rng = random.Random(seed)
    replicates = []
    for _ in range(resamples):
        acc = size = 0
        for d in diffs_per_seed:
            for _ in range(len(d)):
                diff, n = d[rng.randrange(len(d))]
                acc += diff
                size += n
        replicates.append(acc / size)
    replicates.sort()
    low = replicates[int(0.025 * (resamples - 1))]
    high = replicates[int(round(0.975 * (resamples - 1)))]
    return point, low, high


def compare(
    per_seed: Mapping[int, Sequence[Mapping[str, Any]]],
    pairs: Sequence[tuple[str, str]] = COMPARISONS,
    decodings: Sequence[str] = ("greedy",),
    resamples: int = 10_000,
) -> list[dict[str, Any]]:
    """The ``comparisons`` of ``summary.json`` (see the module docstring); pairs whose rows are missing are skipped."""
    seeds = sorted(per_seed)

    def row(seed: int, configuration: str, stage: str, decoding: str) -> Mapping[str, Any] | None:
        for r in per_seed[seed]:
            if (r["configuration"], r["stage"], r["decoding"]) == (configuration, stage, decoding):
                return r
        return None

    def instances(r: Mapping[str, Any]) -> list:
        return list(r.get("instances") or range(len(r["outcomes"])))

    stages = list(dict.fromkeys(r["stage"] for seed in seeds for r in per_seed[seed]))
    out = []
    for decoding in decodings:
        for a, b in pairs:
            for stage in stages:
                ra = [row(s, a, stage, decoding) for s in seeds]
                rb = [row(s, b, stage, decoding) for s in seeds]
                if any(r is None for r in ra + rb):
                    continue
                oa, ob = [list(r["outcomes"]) for r in ra], [list(r["outcomes"]) for r in rb]
                keys = [instances(r) for r in ra]
                if keys != [instances(r) for r in rb]:
                    raise ValueError(f"{a!r} and {b!r} did not play the same instances of stage {stage!r}")
                diff, low, high = paired_bootstrap_difference(
                    oa, ob, resamples, seed=len(out), instances=keys
                )
                out.append(
                    {
                        "a": a,
                        "b": b,
                        "stage": stage,
                        "decoding": decoding,
                        "diff": diff,
                        "ci_low": low,
                        "ci_high": high,
                        "per_seed_diff": [
                            (sum(x) - sum(y)) / max(len(x), 1) for x, y in zip(oa, ob, strict=True)
                        ],
                        "method": f"paired bootstrap over problem instances, stratified by seed ({resamples} resamples)",
                    }
                )
    return out


# ------------------------------------------------------------------------------------------------- the command
@dataclass
class ReproduceConfig:
    """What ``reflect-trl reproduce`` runs. ``demo_overrides`` are :class:`~reflect_trl.demo.DemoConfig` fields
    applied to every seed (``--rl_steps 120``); ``jobs``: worker processes of the pool shared by all seeds' jobs
    (0: the demo's ``jobs``)."""

    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    env_name: str = "taxi"
    output_dir: str | None = None  # default outputs/reproduce/<env>
    smoke: bool = False
    bootstrap_resamples: int = 10_000
    jobs: int = 0
    rerun: bool = False  # False: a seed whose finished run has the same demo configuration is reused
    demo_overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def out(self) -> Path:
        return Path(self.output_dir or f"outputs/reproduce/{self.env_name}")

    def demo_config(self, seed: int):
        """The demo configuration of one seed (validated by :func:`reflect_trl.demo.check_demo_config`)."""
        from reflect_trl.demo import DEFAULT_ENV_KWARGS, DemoConfig

        seed_dir = str(self.out / f"seed_{seed}")
        base = DemoConfig.smoke(seed_dir) if self.smoke else DemoConfig(output_dir=seed_dir)
        settings: dict[str, Any] = {
            "seed": seed,
            "env_name": self.env_name,
            "env_kwargs": dict(DEFAULT_ENV_KWARGS.get(self.env_name, {})),
        }
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
    (every field: seed, steps, data, evaluation); ``None`` when there is none, anything differs or the run predates
    a field."""
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
    """Every seed's demo in one shared pool of ``config.jobs`` worker processes (:func:`reflect_trl.pipeline.run_jobs`):
    models and data are built here, then all seeds' SFT / relabel / RL jobs and each seed's evaluation
    (``reflect-trl demo --evaluate_only``) go into one job graph, seed by seed in list order, so a seed's last
    long job overlaps the next seed's first ones instead of leaving a core idle. Logs: ``seed_<s>/logs/``. With
    ``reflection_backend: openai`` (the demo starts its own server) the seeds run one after the other, one
    ``reflect-trl demo`` process each. Returns each seed's ``summary.json``."""
    from reflect_trl.demo import JOB_TIMINGS, demo_jobs, job_label, prepare_demo
    from reflect_trl.demo import _Progress as Progress
    from reflect_trl.pipeline import Job, run_jobs

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
        base, policy_base, data = prepare_demo(cfg, progress)
        recorded[seed] = {"timings_seconds": dict(progress.timings)}
        seed_jobs = demo_jobs(cfg, base, data, seed_dir / "runs", policy_base=policy_base)
        named = {job.name: f"seed {seed} {job_label(job)} {job.name}" for job in seed_jobs}
        for job in seed_jobs:
            needs = tuple(named[n] for n in job.needs)
            jobs.append(
                replace(job, name=named[job.name], needs=needs, log=seed_dir / "logs" / f"{job.name}.log")
            )
        evaluation = f"seed {seed} evaluation"
        log = seed_dir / "logs" / "evaluation.log"
        argv = ["--config", str(request), "--evaluate_only"]
        jobs.append(Job(evaluation, "demo", argv, tuple(named.values()), log=log))
        seed_of.update(dict.fromkeys([*named.values(), evaluation], seed))

    log_of = {job.name: job.log for job in jobs}

    def report(name: str, event: str, seconds: float) -> None:
        seed = seed_of[name]
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
    run_jobs(jobs, workers=workers, report=report)
    return {
        seed: json.loads((Path(cfg.output_dir) / "summary.json").read_text())
        for seed, cfg in demo_configs.items()
    }


def with_instances(results: Sequence[Mapping[str, Any]], cfg: Any) -> list[dict[str, Any]]:
    """The results of one seed, each with the problem instance of every episode (``instances``): a run evaluated
    before the evaluation recorded them gets them from its demo configuration (the held-out tasks are a function of
    it)."""
    from reflect_trl.demo import demo_eval_settings
    from reflect_trl.evaluation import eval_tasks, instance_keys

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
    from reflect_trl.demo import check_demo_config

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
    summary = {
        "env_name": config.env_name,
        "seeds": list(config.seeds),
        "rows": pool_rows(
            per_seed_results, {seed: training_instances(c) for seed, c in demo_configs.items()}
        ),
        "comparisons": compare(per_seed_results, COMPARISONS, decodings, config.bootstrap_resamples),
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
    from reflect_trl.plotting import (
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
    """Markdown: configurations x stages, pooled success [95 % Wilson] and the per-seed rates."""

    def cell(r: Mapping[str, Any]) -> str:
        seeds = " / ".join(f"{100 * p:.0f}" for p in r["per_seed"])
        return f"{_pct(r['success_rate'])} % [{_pct(r['ci_low'])}, {_pct(r['ci_high'])}] ({seeds})"

    return _stage_grid([r for r in rows if r["decoding"] == decoding], cell)


def exposure_table(rows: Sequence[Mapping[str, Any]], decoding: str) -> str:
    """Markdown: configurations x stages, success on held-out instances seen in training / unseen ("" without)."""
    chosen = [r for r in rows if r["decoding"] == decoding and "seen" in r]
    if not chosen:
        return ""

    def part(p: Mapping[str, Any]) -> str:
        return f"{_pct(p['success_rate'])} % ({p['instances']})" if p["success_rate"] is not None else "– (0)"

    return _stage_grid(chosen, lambda r: f"{part(r['seen'])} / {part(r['unseen'])}")


def comparisons_table(comparisons: Sequence[Mapping[str, Any]], decoding: str) -> str:
    lines = ["| a − b | stage | difference [95 % CI] | per seed |", "|---|---|---|---|"]
    for c in comparisons:
        if c["decoding"] != decoding:
            continue
        per_seed = " / ".join(f"{100 * d:+.0f}" for d in c["per_seed_diff"])
        lines.append(
            f"| {c['a']} − {c['b']} | {c['stage']} | {100 * c['diff']:+.1f} pts "
            f"[{100 * c['ci_low']:+.1f}, {100 * c['ci_high']:+.1f}] | {per_seed} |"
        )
    return "\n".join(lines) + "\n"


def results_markdown(summary: Mapping[str, Any], plots: Sequence[Path] = ()) -> str:
    seeds = summary["seeds"]
    rows = summary["rows"]
    episodes = {r["episodes"] for r in rows}
    parts = [
        f"# reflect-trl reproduce: {summary['env_name']}, seeds {', '.join(map(str, seeds))}\n",
        f"Held-out `test` episodes pooled over {len(seeds)} seeds ({', '.join(map(str, sorted(episodes)))} per "
        "cell); success rate with a 95 % Wilson interval over the distinct problem instances of every seed (a "
        "repeated held-out instance counts once), then each seed's rate in parentheses.\n",
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
            "Differences of pooled success rates, 95 % paired bootstrap over problem instances (stratified by seed):\n",
            comparisons_table(summary["comparisons"], decoding),
        ]
        exposure = exposure_table(rows, decoding)
        if exposure:
            parts += [
                "Held-out episodes whose problem instance was also a training task of the seed (seen) / the others "
                "(unseen): success rate (distinct instances, summed over seeds). The splits hold out task seeds; an "
                "environment with few instances repeats training instances in `test`.\n",
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


def reproduce_cli(argv: Sequence[str] | None = None) -> dict[str, Any]:
    from reflect_trl.config_lists import parse_int_list
    from reflect_trl.demo import parse_demo_overrides

    parser = argparse.ArgumentParser(
        prog="reflect-trl reproduce",
        description="The demo pipeline for several seeds, pooled held-out evaluation and paired comparisons "
        "(summary.json, results.md, plots under outputs/reproduce/<env>/).",
        epilog="Any DemoConfig field can be overridden for every seed: --rl_steps 120.",
    )
    parser.add_argument(
        "--seeds",
        nargs="+",
        default=["0", "1", "2"],
        help="one full run per seed: 0 1 2 or 0,1,2 (default: 0 1 2)",
    )
    parser.add_argument("--env_name", default="taxi", help="environment (default: %(default)s)")
    parser.add_argument("--output_dir", default=None, help="default: outputs/reproduce/<env_name>")
    parser.add_argument("--smoke", action="store_true", help="a handful of steps per stage (tests)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=0,
        help="worker processes (one thread each) of the pool that runs every seed's SFT, relabel, RL and "
        "evaluation jobs (default: the demo's jobs, 2)",
    )
    parser.add_argument(
        "--bootstrap_resamples",
        type=int,
        default=10_000,
        help="resamples of the paired bootstrap (default: 10000)",
    )
    parser.add_argument(
        "--rerun",
        action="store_true",
        help="run every seed again (default: reuse a seed whose finished run has the same configuration)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args, rest = parser.parse_known_args(argv)
    if args.no_progress:
        from reflect_trl.progress import disable_progress

        disable_progress()
    try:
        seeds = parse_int_list(",".join(args.seeds), "--seeds")
    except ValueError as err:
        parser.error(str(err))
    if not seeds or len(set(seeds)) != len(seeds):
        parser.error(f"--seeds {args.seeds}: give distinct integer seeds")
    if args.jobs < 0:
        parser.error(f"--jobs {args.jobs}: must be >= 1 (0: the demo's jobs)")
    overrides = parse_demo_overrides(rest, parser, exclude=("seed", "output_dir", "env_name"))
    config = ReproduceConfig(
        seeds=seeds,
        env_name=args.env_name,
        output_dir=args.output_dir,
        smoke=args.smoke,
        bootstrap_resamples=args.bootstrap_resamples,
        jobs=args.jobs,
        rerun=args.rerun,
        demo_overrides=overrides,
    )
    return run_reproduce(config)


__all__ = [
    "COMPARISONS",
    "ReproduceConfig",
    "compare",
    "paired_bootstrap_difference",
    "pool_rows",
    "reproduce_cli",
    "run_reproduce",
]
