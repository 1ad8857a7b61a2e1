"""Focused RL: can RL flip the greedy decisions of the Reflect SFT policy where it fails, when it trains on those
DangerousTaxi instances only? (docs/experiments.md §5)

    .venv/bin/python benchmarks/focused_rl.py --policy outputs/reproduce/taxi/seed_0/runs/sft_policy \
        --reflection outputs/reproduce/taxi/seed_0/runs/sft_reflection --start_states 96 477 \
        --output_dir outputs/bench/focused/tiny_96_477 [-- more `reflect-trl rl` flags]

RL with the CPU recipe's settings on the `dropoff` stage only, 60 steps, exploration epsilon 0.25, on training tasks
whose start state is one of ``--start_states`` (no other instance is rehearsed); then the policy before and after is
played greedily from every `dropoff` start state (validation split, seed 777: all 12 appear) and the script prints
which start states RL fixed and which it broke. ``summary.json`` holds the per-start-state outcomes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from reflect_trl.envs import register_env  # noqa: E402
from reflect_trl.envs.taxi import DangerousTaxiEnv  # noqa: E402


class FocusedTaxi(DangerousTaxiEnv):
    """DangerousTaxi whose `train` split holds only tasks that start in one of ``focus`` (other splits unchanged)."""

    focus: frozenset[int] = frozenset()

    def make_tasks(self, split, n, seed=0, difficulty=None):
        if split != "train" or not self.focus:
            return super().make_tasks(split, n, seed, difficulty)
        tasks: list = []
        for k in range(50):  # task seeds are drawn per batch of 200 until n tasks start in a focused state
            batch = super().make_tasks(split, 200, seed + 7919 * k, difficulty)
            tasks += [t for t in batch if t.data["start_state"] in self.focus]
            if len(tasks) >= n:
                return tasks[:n]
        raise ValueError(f"no {difficulty or 'taxi'} training task starts in {sorted(self.focus)}")


def outcomes_by_start_state(transcripts: Path) -> dict[int, bool]:
    """Start state -> success of the greedy episode (all episodes from one start state play out alike)."""
    out: dict[int, bool] = {}
    for line in transcripts.read_text().splitlines():
        row = json.loads(line)
        out[int(row["task"]["data"]["start_state"])] = bool(row["success"])
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", required=True, help="SFT'd policy (RL's start)")
    parser.add_argument("--reflection", required=True, help="SFT'd reflection model")
    parser.add_argument(
        "--start_states", nargs="+", type=int, required=True, help="dropoff start states trained on"
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--output_dir", default="outputs/bench/focused")
    parser.add_argument("rl_args", nargs=argparse.REMAINDER, help="after --: more `reflect-trl rl` flags")
    args = parser.parse_args(argv)
    out = Path(args.output_dir)
    run = out / "rl"
    FocusedTaxi.focus = frozenset(args.start_states)
    if not (run / "log_history.json").is_file():
        register_env("taxi", FocusedTaxi)
        from reflect_trl.trainers.rl import run_rl

        recipe = ROOT / "recipes/taxi/cpu/rl.yaml"
        run_rl(["--config", str(recipe), "--model_name_or_path", args.policy,
                "--reflection_model_name_or_path", args.reflection, "--curriculum_stages", "dropoff",
                "--max_steps", str(args.steps), "--num_train_tasks", "16", "--exploration_epsilon", "0.25",
                "--output_dir", str(run), "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true",
                *[a for a in args.rl_args if a != "--"]])  # fmt: skip
    eval_dir = out / "eval"
    if not (eval_dir / "results.json").is_file():
        subprocess.run(
            [sys.executable, "-m", "reflect_trl.cli", "--no-progress", "eval", "--split", "validation", "--seed", "777",
             "--stages", "dropoff", "--episodes_per_stage", "300", "--decodings", "greedy",
             "--reflection_max_new_tokens", "48", "--output_dir", str(eval_dir),
             "--policy", args.policy, "--reflection", args.reflection, "--name", "before",
             "--policy", str(run), "--reflection", args.reflection, "--name", "after"],
            check=True,
        )  # fmt: skip
    before = outcomes_by_start_state(eval_dir / "transcripts" / "before__dropoff__greedy.jsonl")
    after = outcomes_by_start_state(eval_dir / "transcripts" / "after__dropoff__greedy.jsonl")
    summary = {
        "trained_start_states": sorted(args.start_states),
        "before": {str(k): v for k, v in sorted(before.items())},
        "after": {str(k): v for k, v in sorted(after.items())},
        "fixed": sorted(s for s in before if not before[s] and after.get(s)),
        "broken": sorted(s for s in before if before[s] and not after.get(s, False)),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"[focused] solved before {sum(before.values())}/{len(before)}, after {sum(after.values())}/{len(after)}; "
        f"fixed {summary['fixed']}, broken {summary['broken']}"
    )
    return summary


if __name__ == "__main__":
    main()
