"""Before/after check of the RL loss rewrite: one RL run with the code of an earlier commit (GRPO's ``_compute_loss``
fed through hooks) and one with this checkout (``rl_math.turn_losses`` in ``ReflectPPOTrainer.compute_loss``), same
seed and settings, with the checkout's two intended behaviour changes of the same commit switched back -- a task's
episodes sharing the task's start state and environment seed -- so that only the loss path differs. Prints the
largest per-step differences of the logged metrics and of the final weights.

    .venv/bin/python benchmarks/loss_path_equivalence.py --before 8dea9f7 \
        --policy outputs/demo/runs/sft_policy --reflection outputs/demo/runs/sft_reflection

(any SFT'd tiny policy / reflection pair works; the earlier commit's code is checked out with ``git worktree`` into a
temporary directory and removed afterwards).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUN = r"""
import json, sys
which, src, out, policy, reflection, steps = sys.argv[1:7]
sys.path.insert(0, src)
if which == "after":
    from reflect_trl.envs import taxi
    from reflect_trl.envs.base import Task
    from reflect_trl.seeding import derive_seed
    from reflect_trl.trainers import rl

    def reset_from_episode_seed(self, seed=None, task=None):  # the earlier semantics: the episode seed wins
        mode = self.fixed_mode or (task.difficulty if task is not None else "full")
        if seed is None:
            seed = task.seed if task is not None else self._seed_rng.randrange(2**31)
        if task is None:
            task = Task(env=self.name, task_id=f"taxi-seed{seed}-{mode}", difficulty=mode, seed=int(seed))
        return self._begin(taxi.episode_start_state(seed, mode), mode, task)

    taxi.DangerousTaxiEnv.reset = reset_from_episode_seed
    rl.ReflectPPOTrainer._episode_seeds = lambda self, groups: [
        derive_seed(self.args.seed, self.accelerator.process_index, self._rollouts, i) for i in range(len(groups))
    ]
from reflect_trl.trainers.rl import run_rl

trainer = run_rl([
    "--model_name_or_path", policy, "--reflection_model_name_or_path", reflection, "--env_name", "taxi",
    "--env_kwargs", json.dumps({"step_reward": 0.0}), "--max_steps", steps, "--per_device_train_batch_size", "16",
    "--num_generations", "4", "--num_iterations", "2", "--learning_rate", "5e-4", "--advantage_estimator", "rloo",
    "--reflection_max_new_tokens", "48", "--reflection_temperature", "0", "--num_train_tasks", "100",
    "--task_seed", "0", "--curriculum", "true", "--logging_steps", "1", "--output_dir", out, "--use_cpu", "true",
    "--bf16", "false", "--seed", "0", "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true",
    "--log_episodes_every", "0",
])
model = trainer.accelerator.unwrap_model(trainer.model)
weights = {n: p.detach().double().flatten().tolist() for n, p in model.named_parameters()}
json.dump(weights, open(out + "/weights.json", "w"))
"""


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="8dea9f7", help="the commit before the loss rewrite")
    parser.add_argument("--policy", required=True)
    parser.add_argument("--reflection", required=True)
    parser.add_argument("--steps", default="30")
    parser.add_argument("--output_dir", default="outputs/bench/loss_path")
    args = parser.parse_args(argv)
    out = Path(args.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        worktree = Path(tmp) / "before"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.before], check=True
        )
        try:
            for which, src in (("before", worktree / "src"), ("after", ROOT / "src")):
                run_dir = out / which
                run_dir.mkdir(exist_ok=True)
                cmd = [
                    sys.executable,
                    "-c",
                    RUN,
                    which,
                    str(src),
                    str(run_dir),
                    args.policy,
                    args.reflection,
                    args.steps,
                ]
                subprocess.run(cmd, check=True, env={**os.environ, "WANDB_MODE": "disabled"})
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], check=False
            )
    histories = {w: json.loads((out / w / "log_history.json").read_text()) for w in ("before", "after")}
    report: dict = {"before": args.before, "steps": int(args.steps), "metrics": {}}
    for key in ("env/success_rate", "env/return", "env/episode_length", "entropy", "loss", "grad_norm"):
        a = [h[key] for h in histories["before"] if key in h]
        b = [h[key] for h in histories["after"] if key in h]
        report["metrics"][key] = {
            "logs": [len(a), len(b)],
            "max_abs_diff": max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0),
        }
    wa = json.loads((out / "before" / "weights.json").read_text())
    wb = json.loads((out / "after" / "weights.json").read_text())
    common = sorted(set(wa) & set(wb))
    report["weights_max_abs_diff"] = max(
        max(abs(x - y) for x, y in zip(wa[n], wb[n], strict=True)) for n in common
    )
    report["weights_max_abs"] = max(max(abs(x) for x in wa[n]) for n in common)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
