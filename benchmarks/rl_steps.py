"""An RL variant on `validation`: rerun `make reproduce` seeds' `rl_reflect` jobs with ``--steps`` instead of the
demo's ``rl_steps`` and any RL flags given after ``--`` (every other argument the demo's, read from the seed's
``demo_config.json``), then evaluate the SFT start, the seed's own ``rl_reflect`` and the variant greedily on 300
`validation` episodes per stage (seed 777). How many RL steps (docs/experiments.md §2, fourth round):

    .venv/bin/python benchmarks/rl_steps.py --seed_dirs outputs/reproduce/taxi/seed_0 outputs/reproduce/taxi/seed_1 \
        --steps 150 --output_dir outputs/bench/rl_steps_val

GiGPO without the std scaling (docs/experiments.md §1):

    .venv/bin/python benchmarks/rl_steps.py --seed_dirs outputs/reproduce/taxi/seed_{0,1,2} --steps 300 \
        --name unscaled --output_dir outputs/bench/rl_unscaled_val -- --scale_rewards none

The SFT anchor on each seed's own policy data (``{seed_dir}`` is replaced by the seed's folder), with the greedy
`validation` curve of every 25 steps (evaluation during training):

    .venv/bin/python benchmarks/rl_steps.py --seed_dirs outputs/reproduce/taxi/seed_{0,1,2} --steps 300 \
        --name anchor1 --output_dir outputs/bench/rl_anchor_val -- --sft_anchor_coef 1 \
        --sft_anchor_data {seed_dir}/data/taxi/policy_reflect_model --eval_strategy steps --eval_steps 25 \
        --eval_on_start true --eval_episodes_per_stage 300

-> ``<output_dir>/<name>_seed<s>/`` (the RL run; ``--name`` defaults to ``rl<steps>``),
``<output_dir>/eval_seed<s>/results.md``. The RL runs go two at a time (one thread each); a step whose output exists
is skipped.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))  # reflection_memo, when loaded from elsewhere

from reflect_trl.pipeline import Job, run_jobs  # noqa: E402
from reflect_trl.reflection.cache import DEFAULT_REFLECTION_CACHE_SIZE  # noqa: E402
from reflection_memo import demo_config, rl_argv  # noqa: E402


def rl_reflect_job(seed_dir: Path, steps: int, output_dir: Path, extra: list[str] | None = None) -> Job:
    """The seed's `rl_reflect` job as the demo built it, with ``steps`` RL steps into ``output_dir`` and the RL flags
    ``extra`` appended (a later flag wins; ``{seed_dir}`` in a flag stands for the seed's folder)."""
    argv = rl_argv(seed_dir, steps, output_dir, DEFAULT_REFLECTION_CACHE_SIZE)
    flags = [flag.replace("{seed_dir}", str(seed_dir)) for flag in extra or []]
    return Job(output_dir.name, "rl", argv[4:] + flags)  # without "python -m reflect_trl.cli rl"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seed_dirs", nargs="+", required=True, help="seed folders of a `make reproduce` run"
    )
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--output_dir", default="outputs/bench/rl_steps_val")
    parser.add_argument("--name", default=None, help="the variant's name (default: rl<steps>)")
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    out, name = Path(args.output_dir), args.name or f"rl{args.steps}"
    seeds = {Path(d): demo_config(Path(d)).seed for d in args.seed_dirs}
    jobs = [
        rl_reflect_job(d, args.steps, out / f"{name}_seed{s}", extra)
        for d, s in seeds.items()
        if not (out / f"{name}_seed{s}" / "log_history.json").is_file()
    ]
    run_jobs(jobs, workers=args.jobs, log_dir=out / "logs")
    for seed_dir, seed in seeds.items():
        runs, evaluation = seed_dir / "runs", out / f"eval_seed{seed}"
        if (evaluation / "results.md").is_file():
            continue
        configurations = [
            ("sft", runs / "sft_policy"),
            ("rl", runs / "rl_reflect"),
            (name, out / f"{name}_seed{seed}"),
        ]
        command = [sys.executable, "-m", "reflect_trl.cli", "--no-progress", "eval"]
        reflection = str(runs / "sft_reflection")
        for label, policy in configurations:
            command += ["--policy", str(policy), "--reflection", reflection, "--name", label]
        command += ["--split", "validation", "--seed", "777", "--episodes_per_stage", "300", "--decodings", "greedy",
                    "--reflection_temperature", "0", "--reflection_max_new_tokens", "48",
                    "--output_dir", str(evaluation)]  # fmt: skip
        subprocess.run(command, check=True)


if __name__ == "__main__":
    main()
