"""Advantage estimators side by side: the DangerousTaxi CPU RL recipe from the same SFT checkpoints, for every
(estimator, seed), then held-out evaluation of every run after the same number of steps.

    .venv/bin/python benchmarks/advantage_estimators.py \
        --policy outputs/reproduce/taxi/seed_0/runs/sft_policy \
        --reflection outputs/reproduce/taxi/seed_0/runs/sft_reflection \
        --estimators rloo gae gigpo --seeds 0 1 2 --output_dir outputs/bench/estimators

Writes ``summary.json`` (per run: held-out success per stage with the outcomes, training success per step, the
step-grouping statistics of gigpo), ``results.md`` and ``estimators.png`` (training success per step, mean over seeds
with every seed's curve faint; held-out success per stage, pooled over seeds with 95 % Wilson intervals). RL runs go
through :func:`reflect_trl.pipeline.run_jobs` (``--jobs`` at a time, one thread each).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from reflect_trl.evaluation import EvalConfiguration, EvalSettings, evaluate, instance_interval  # noqa: E402
from reflect_trl.pipeline import Job, run_jobs  # noqa: E402
from reflect_trl.reproduce import paired_bootstrap_difference  # noqa: E402

STAGES = ("pickup", "dropoff", "full")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", required=True, help="SFT'd policy (RL's start)")
    parser.add_argument("--reflection", required=True, help="SFT'd reflection model")
    parser.add_argument("--estimators", nargs="+", default=["rloo", "gae", "gigpo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--recipe", default=str(ROOT / "recipes/taxi/cpu/rl.yaml"))
    parser.add_argument("--split", default="validation", help="held-out split of the evaluation")
    parser.add_argument("--episodes", type=int, default=300, help="held-out episodes per stage")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--output_dir", default="outputs/bench/estimators")
    parser.add_argument("rl_args", nargs=argparse.REMAINDER, help="after --: more `reflect-trl rl` flags")
    args = parser.parse_args(argv)
    out = Path(args.output_dir)
    extra = [a for a in args.rl_args if a != "--"]
    jobs = []
    for estimator in args.estimators:
        for seed in args.seeds:
            run = out / f"{estimator}_seed{seed}"
            if (run / "log_history.json").is_file():
                continue
            argv_rl = ["--config", args.recipe, "--model_name_or_path", args.policy,
                       "--reflection_model_name_or_path", args.reflection, "--advantage_estimator", estimator,
                       "--seed", str(seed), "--output_dir", str(run), "--report_to", "none", "--save_strategy", "no",
                       "--disable_tqdm", "true", *extra]  # fmt: skip
            jobs.append(Job(f"{estimator}_seed{seed}", "rl", argv_rl))
    run_jobs(
        jobs,
        workers=args.jobs,
        log_dir=out / "logs",
        report=lambda n, e, s: print(f"[bench] {n} {e} {s:.0f}s"),
    )

    configurations = [EvalConfiguration("SFT (start)", args.policy, args.reflection)] + [
        EvalConfiguration(f"{e} seed {s}", str(out / f"{e}_seed{s}"), args.reflection)
        for e in args.estimators
        for s in args.seeds
    ]
    settings = EvalSettings(env_name="taxi", episodes_per_stage=args.episodes, decodings=["greedy"], split=args.split,
                            seed=4242, reflection_max_new_tokens=48)  # fmt: skip
    report = evaluate(configurations, settings, progress=False)
    results = {(r.configuration, r.stage): r for r in report.results}
    summary: dict = {"policy": args.policy, "reflection": args.reflection, "split": args.split, "runs": {}}
    for e in args.estimators:
        for s in args.seeds:
            history = json.loads((out / f"{e}_seed{s}" / "log_history.json").read_text())
            summary["runs"][f"{e}_seed{s}"] = {
                "estimator": e,
                "seed": s,
                "held_out": {st: results[(f"{e} seed {s}", st)].success_rate for st in STAGES},
                "train_success": [
                    [h["step"], h["env/success_rate"]] for h in history if "env/success_rate" in h
                ],
                "gigpo": {
                    k: [h[k] for h in history if k in h]
                    for k in (
                        "gigpo/grouped_turn_share",
                        "gigpo/mean_step_group_size",
                        "gigpo/step_advantage_std",
                    )
                },
            }
    start = {st: results[("SFT (start)", st)] for st in STAGES}
    lines = [f"Held-out `{args.split}` success, greedy, {args.episodes} episodes per stage and run; pooled over "
             f"seeds {args.seeds} (95 % Wilson over distinct instances) and the paired difference to the SFT start "
             "(bootstrap over instances).", "",
             "| run | " + " | ".join(STAGES) + " |", "|---|" + "---|" * len(STAGES)]  # fmt: skip
    lines.append(
        "| SFT (start) | " + " | ".join(f"{100 * start[st].success_rate:.1f} %" for st in STAGES) + " |"
    )
    pooled = {}
    for e in args.estimators:
        cells = []
        for st in STAGES:
            rs = [results[(f"{e} seed {s}", st)] for s in args.seeds]
            k, n = sum(r.successes for r in rs), sum(r.episodes for r in rs)
            # the interval counts the distinct instances of every run
            distinct = sum(len(set(r.instances)) for r in rs)
            lo, hi = instance_interval(k / n, distinct)
            d, dlo, dhi = paired_bootstrap_difference(
                [r.outcomes for r in rs], [start[st].outcomes] * len(rs), resamples=2000,
                instances=[r.instances for r in rs],
            )  # fmt: skip
            pooled[(e, st)] = {"success": k / n, "ci": [lo, hi], "diff_vs_start": [d, dlo, dhi]}
            per_seed = "/".join(f"{100 * r.success_rate:.0f}" for r in rs)
            cells.append(f"{100 * k / n:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}] ({per_seed}); "
                         f"{100 * d:+.1f} [{100 * dlo:+.1f}, {100 * dhi:+.1f}]")  # fmt: skip
        lines.append(f"| {e} | " + " | ".join(cells) + " |")
    summary["pooled"] = {f"{e}/{st}": v for (e, st), v in pooled.items()}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    plot(summary, args, out / "estimators.png")
    print("\n".join(lines))
    return summary


def plot(summary: dict, args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    for i, e in enumerate(args.estimators):
        color = f"C{i}"
        curves = [summary["runs"][f"{e}_seed{s}"]["train_success"] for s in args.seeds]
        for c in curves:
            ax1.plot([x for x, _ in c], [y for _, y in c], color=color, alpha=0.15, lw=0.8)
        n = min(len(c) for c in curves)
        steps = [curves[0][j][0] for j in range(n)]
        mean = [sum(c[j][1] for c in curves) / len(curves) for j in range(n)]
        window = 5
        smooth = [
            sum(mean[max(0, j - window + 1) : j + 1]) / len(mean[max(0, j - window + 1) : j + 1])
            for j in range(n)
        ]
        ax1.plot(steps, smooth, color=color, label=e)
        for j, st in enumerate(STAGES):
            p = summary["pooled"][f"{e}/{st}"]
            x = j + (i - (len(args.estimators) - 1) / 2) * 0.25
            ax2.bar(x, p["success"], width=0.25, color=color, label=e if j == 0 else None,
                    yerr=[[p["success"] - p["ci"][0]], [p["ci"][1] - p["success"]]], capsize=3)  # fmt: skip
    ax1.set_xlabel("optimizer step (curriculum: pickup, dropoff, full in thirds)")
    ax1.set_ylabel("training success (mean over seeds, 5-log moving average)")
    ax1.legend()
    ax2.set_xticks(range(len(STAGES)), STAGES)
    ax2.set_ylabel(f"held-out success ({args.split}, greedy)")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
