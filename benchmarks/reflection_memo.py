"""What the greedy reflection memo (``reflection_cache_size``, ``reflect_trl.reflection.cache``) saves, and that it
changes nothing, on one seed of ``make reproduce``:

    .venv/bin/python benchmarks/reflection_memo.py --seed_dir outputs/reproduce/taxi/seed_2 \\
        --rl_steps 60 --output outputs/bench/reflection_memo.json

* ``eval``: the seed's held-out evaluation (the demo's settings: every configuration, stage and decoding), once
  with the memo and once without; wall time of each and the number of episodes whose transcripts differ.
* ``rl``: ``--rl_steps`` steps of the seed's ``rl_reflect`` run (the same arguments, from its SFT checkpoints),
  with ``--reflection_cache_size 0`` and with the default; train runtime, summed rollout seconds, the mean hit rate
  and the number of logged values that differ.

Run it alone on the machine: both halves are timings.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from reflect_trl.demo import (  # noqa: E402
    DemoConfig,
    demo_config_from_cli,
    demo_eval_configurations,
    demo_eval_settings,
    demo_jobs,
)
from reflect_trl.evaluation import evaluate  # noqa: E402
from reflect_trl.reflection.cache import DEFAULT_REFLECTION_CACHE_SIZE  # noqa: E402

COMPARED = ("loss", "env/success_rate", "entropy", "kl", "rollout/reflection_tokens", "grad_norm")


def demo_config(seed_dir: Path) -> DemoConfig:
    path = seed_dir / "demo_config.json"
    if not path.is_file():
        raise SystemExit(f"{path} is missing: --seed_dir must be a finished demo / reproduce seed folder")
    return demo_config_from_cli(["--config", str(path)])


def eval_half(seed_dir: Path) -> dict:
    cfg = demo_config(seed_dir)
    confs = demo_eval_configurations(seed_dir / "runs")
    out, transcripts = {}, {}
    for name, size in (("without_memo", 0), ("with_memo", DEFAULT_REFLECTION_CACHE_SIZE)):
        settings = demo_eval_settings(cfg)
        settings.reflection_cache_size = size
        start = time.perf_counter()
        report = evaluate(confs, settings, progress=False)
        out[f"{name}_seconds"] = round(time.perf_counter() - start, 1)
        transcripts[name] = report.transcripts
        print(f"[memo] eval {name}: {out[f'{name}_seconds']} s", file=sys.stderr, flush=True)
    a, b = transcripts["without_memo"], transcripts["with_memo"]
    out["episodes"] = sum(len(v) for v in a.values())
    out["episodes_that_differ"] = sum(x != y for key in a for x, y in zip(a[key], b[key], strict=True))
    return out


def rl_argv(seed_dir: Path, steps: int, output_dir: Path, cache_size: int) -> list[str]:
    """The seed's ``rl_reflect`` command (from its log's recorded arguments) with ``steps`` and a new output dir."""
    cfg = demo_config(seed_dir)
    jobs = demo_jobs(cfg, seed_dir / "models", seed_dir / "data" / cfg.env_name, seed_dir / "runs")
    job = next(j for j in jobs if j.name == "rl_reflect")
    argv = list(job.argv)

    def replace(flag: str, value: str) -> None:
        i = argv.index(flag)
        argv[i + 1] = value

    replace("--max_steps", str(steps))
    replace("--output_dir", str(output_dir))
    replace("--report_to", "none")
    return [sys.executable, "-m", "reflect_trl.cli", "rl", *argv, "--reflection_cache_size", str(cache_size)]


def rl_half(seed_dir: Path, steps: int, work: Path) -> dict:
    out, logs = {}, {}
    for name, size in (("without_memo", 0), ("with_memo", DEFAULT_REFLECTION_CACHE_SIZE)):
        run_dir = work / name
        start = time.perf_counter()
        subprocess.run(rl_argv(seed_dir, steps, run_dir, size), check=True, capture_output=True, text=True)
        wall = time.perf_counter() - start
        history = json.loads((run_dir / "log_history.json").read_text())
        logs[name] = history
        rates = [
            h["rollout/reflection_cache_hit_rate"]
            for h in history
            if "rollout/reflection_cache_hit_rate" in h
        ]
        out[name] = {
            "wall_seconds": round(wall, 1),
            "train_runtime": next(h["train_runtime"] for h in history if "train_runtime" in h),
            "rollout_seconds": round(sum(h.get("rollout/seconds", 0.0) for h in history), 1),
            "mean_hit_rate": round(sum(rates) / len(rates), 3) if rates else None,
        }
        print(f"[memo] rl {name}: {out[name]}", file=sys.stderr, flush=True)
    a, b = logs["without_memo"], logs["with_memo"]
    out["logged_values"] = sum(1 for h in a for k in COMPARED if k in h)
    out["logged_values_that_differ"] = sum(
        1 for x, y in zip(a, b, strict=True) for k in COMPARED if k in x and x[k] != y.get(k)
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seed_dir", type=Path, required=True, help="a finished demo / reproduce seed folder"
    )
    parser.add_argument(
        "--rl_steps", type=int, default=60, help="RL steps of each RL half (0 skips the RL half)"
    )
    parser.add_argument("--skip_eval", action="store_true")
    parser.add_argument("--output", type=Path, default=Path("outputs/bench/reflection_memo.json"))
    args = parser.parse_args()
    if args.rl_steps < 0:
        parser.error(f"--rl_steps must be >= 0, got {args.rl_steps}")
    result: dict = {"seed_dir": str(args.seed_dir)}
    if not args.skip_eval:
        result["eval"] = eval_half(args.seed_dir)
    if args.rl_steps:
        result["rl_steps"] = args.rl_steps
        result["rl"] = rl_half(args.seed_dir, args.rl_steps, args.output.with_suffix("") / "rl")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
