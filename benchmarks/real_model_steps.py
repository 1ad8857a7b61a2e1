"""Seconds per SFT step and per RL step (split into its parts) and peak memory, tiny model vs a real model
(docs/performance.md, "A real model on this CPU").

Each model runs in its own process (so its peak RSS is its own), at smoke sizes, with the trainers' own code paths:

* SFT: ``ReflectSFTTrainer`` on the policy data and on the reflection data of ``reflect-trl data`` (batch
  ``--sft_batch_size``), one warm-up step, then the median of ``--sft_steps`` timed optimizer steps;
* RL: ``ReflectPPOTrainer`` with a frozen reflection player (the model itself, untrained), ``num_iterations`` 2,
  ``beta`` 0.05, gigpo, greedy reflections of ``--reflection_tokens`` tokens, ``--rl_batch_size`` turns-worth of
  episodes (``num_generations`` 4) on the first curriculum stage (``pickup``): one rollout, two optimizer steps. The
  rollout's own timers split it into reflection generation, policy forward (the acting policy scores the options),
  tokenization and environment steps; the old/reference scoring forwards and the loss forward + backward are timed
  around the trainer's hooks.

The tiny model trains all its parameters (as the CPU recipes do), a ``--lora`` model trains LoRA adapters
(``all-linear``, r 16; as the real-model recipes do).

    .venv/bin/python benchmarks/real_model_steps.py \
        --model tiny=models/tiny-llama-taxi --model smollm2=models/smollm2-135m-instruct:lora \
        --output outputs/bench/real_model_steps.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def _rss_mib() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _data(out: Path) -> Path:
    """A small DangerousTaxi SFT data set (``reflect-trl data``) under ``out``."""
    from reflect_trl.cli.data import build_datasets_cli

    build_datasets_cli(
        [
            "--env_name",
            "taxi",
            "--n_train_tasks",
            "6",
            "--n_val_tasks",
            "2",
            "--seed",
            "0",
            "--output_dir",
            str(out),
        ]
    )
    return out / "taxi"


class _StepTimer:
    """A TrainerCallback-like recorder of each optimizer step's wall time."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._start = 0.0

    def callback(self):
        from transformers import TrainerCallback

        timer = self

        class Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                timer._start = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                timer.seconds.append(time.perf_counter() - timer._start)

        return Callback()


def _lora():
    from peft import LoraConfig

    return LoraConfig(
        r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM"
    )


def sft_steps(model_dir: str, data: Path, role: str, lora: bool, batch: int, steps: int, out: Path) -> dict:
    """Median seconds of ``steps`` SFT optimizer steps after one warm-up step."""
    from datasets import Dataset

    from reflect_trl.models import load_tokenizer
    from reflect_trl.trainers.sft_config import ReflectSFTConfig
    from reflect_trl.trainers.sft_trainer import ReflectSFTTrainer

    name = "policy_reflect" if role == "policy" else "reflection"
    rows = [json.loads(x) for x in (data / f"{name}.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if r.get("split", "train") == "train"][: batch * (steps + 1)]
    columns = ("prompt", "completion", "num_options") if role == "policy" else ("prompt", "completion")
    timer = _StepTimer()
    trainer = ReflectSFTTrainer(
        model=model_dir,
        args=ReflectSFTConfig(
            output_dir=str(out / f"sft_{role}"),
            role=role,
            use_cpu=True,
            bf16=False,
            report_to="none",
            per_device_train_batch_size=batch,
            max_steps=steps + 1,
            learning_rate=1e-4,
            save_strategy="no",
            logging_steps=1000,
            dataset_num_proc=None,
            seed=0,
        ),
        train_dataset=Dataset.from_list([{k: r[k] for k in columns} for r in rows]),
        processing_class=load_tokenizer(model_dir),
        peft_config=_lora() if lora else None,
        callbacks=[timer.callback()],
    )
    tokens = [len(x) for x in trainer.train_dataset["input_ids"]]
    trainer.train()
    return {
        "step_seconds": timer.seconds,
        "median_step_seconds": statistics.median(timer.seconds[1:]),
        "tokens_per_row_mean": sum(tokens) / len(tokens),
        "trainable_parameters": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
    }


def rl_step(model_dir: str, lora: bool, batch: int, reflection_tokens: int, out: Path) -> dict:
    """One rollout + its two optimizer steps, split into parts (see the module docstring)."""
    from reflect_trl import rollout
    from reflect_trl.envs import make_env
    from reflect_trl.models import load_causal_lm, load_tokenizer
    from reflect_trl.trainers.rl_config import ReflectPPOConfig
    from reflect_trl.trainers.rl_tasks import tasks_to_dataset
    from reflect_trl.trainers.rl_trainer import ReflectPPOTrainer

    parts: dict[str, float] = {"scoring_old_ref_s": 0.0, "loss_forward_s": 0.0, "backward_s": 0.0}
    engine_timings: list[Any] = []
    original_run = rollout.RolloutEngine.run

    def run(self, *args, **kwargs):
        episodes = original_run(self, *args, **kwargs)
        engine_timings.append(self.timings)
        return episodes

    rollout.RolloutEngine.run = run
    tasks = make_env("taxi").make_tasks("train", 8, seed=0, difficulty="pickup")
    timer = _StepTimer()
    args = ReflectPPOConfig(
        output_dir=str(out / "rl"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=batch,
        num_generations=4,
        num_iterations=2,
        max_steps=2,
        learning_rate=1e-4,
        advantage_estimator="gigpo",
        gamma=1.0,
        beta=0.05,
        env_kwargs={"step_reward": 0},
        reflection_max_new_tokens=reflection_tokens,
        reflection_temperature=0.0,
        replay_buffer_size=0,
        curriculum=True,
        logging_steps=1,
        save_strategy="no",
        log_episodes_every=1000,
        seed=0,
    )
    trainer = ReflectPPOTrainer(
        model=load_causal_lm(model_dir),
        args=args,
        train_dataset=tasks_to_dataset(tasks),
        processing_class=load_tokenizer(model_dir),
        reflection_model=load_causal_lm(model_dir, trainable=False),
        reflection_tokenizer=load_tokenizer(model_dir),
        peft_config=_lora() if lora else None,
        callbacks=[timer.callback()],
    )

    def timed(fn, key):
        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                parts[key] += time.perf_counter() - start

        return wrapper

    trainer._add_old_and_reference_logps = timed(trainer._add_old_and_reference_logps, "scoring_old_ref_s")
    trainer.compute_loss = timed(trainer.compute_loss, "loss_forward_s")
    trainer.accelerator.backward = timed(trainer.accelerator.backward, "backward_s")
    try:
        trainer.train()
    finally:
        rollout.RolloutEngine.run = original_run
    t = engine_timings[0]
    logs = [h for h in trainer.state.log_history if "rollout/seconds" in h]
    return {
        "step_seconds": timer.seconds,
        "rollout_seconds": logs[0]["rollout/seconds"] if logs else None,
        "reflection_generate_s": t.reflection_s,
        "reflection_tokens": t.reflection_tokens,
        "policy_forward_s": t.policy_s,
        "tokenize_s": t.tokenize_s,
        "env_s": t.env_s,
        "env_steps": t.env_steps,
        **parts,
        "trainable_parameters": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
    }


def measure_one(label: str, model_dir: str, lora: bool, ns: argparse.Namespace) -> dict[str, Any]:
    """Everything for one model, in this process."""
    torch.manual_seed(0)
    torch.set_num_threads(ns.threads)
    result: dict[str, Any] = {"label": label, "model": model_dir, "lora": lora}
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    result["architecture"] = config.architectures[0] if config.architectures else config.model_type
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        data = _data(out / "data")
        result["rss_after_data_mib"] = _rss_mib()
        start = time.perf_counter()
        result["sft_policy"] = sft_steps(
            model_dir, data, "policy", lora, ns.sft_batch_size, ns.sft_steps, out
        )
        result["sft_reflection"] = sft_steps(
            model_dir, data, "reflection", lora, ns.sft_batch_size, ns.sft_steps, out
        )
        result["rss_after_sft_mib"] = _rss_mib()
        result["rl"] = rl_step(model_dir, lora, ns.rl_batch_size, ns.reflection_tokens, out)
        result["peak_rss_mib"] = _rss_mib()
        result["wall_seconds"] = time.perf_counter() - start
    return result


def _table(results: list[dict[str, Any]]) -> str:
    head = (
        "| model | SFT policy s/step | SFT reflection s/step | RL reflection generation s | RL policy forward s "
        "| RL old+ref scoring s | RL loss fwd+bwd s (2 steps) | RL rollout+step total s | peak RSS MiB |"
    )
    lines = [head, "|" + "---|" * 9]
    for r in results:
        rl = r["rl"]
        lines.append(
            f"| {r['label']} | {r['sft_policy']['median_step_seconds']:.2f} | "
            f"{r['sft_reflection']['median_step_seconds']:.2f} | {rl['reflection_generate_s']:.2f} | "
            f"{rl['policy_forward_s']:.2f} | {rl['scoring_old_ref_s']:.2f} | "
            f"{rl['loss_forward_s'] + rl['backward_s']:.2f} | {sum(rl['step_seconds']):.1f} | {r['peak_rss_mib']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        help="label=path[:lora] (repeatable); each runs in its own process",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per process (default: %(default)s)"
    )
    parser.add_argument("--sft_batch_size", type=int, default=4)
    parser.add_argument("--sft_steps", type=int, default=2, help="timed SFT steps after one warm-up step")
    parser.add_argument(
        "--rl_batch_size", type=int, default=8, help="episodes per rollout (num_generations 4)"
    )
    parser.add_argument("--reflection_tokens", type=int, default=16)
    parser.add_argument("--output", default="outputs/bench/real_model_steps.json")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child process: one model
    ns = parser.parse_args(argv)
    if ns.one:
        label, _, spec = ns.model[0].partition("=")
        path, _, flag = spec.partition(":")
        print("RESULT " + json.dumps(measure_one(label, path, flag == "lora", ns)), flush=True)
        return []
    results = []
    for spec in ns.model:
        child = [a for a in (argv if argv is not None else sys.argv[1:])]
        keep = [a for i, a in enumerate(child) if a != "--model" and (i == 0 or child[i - 1] != "--model")]
        proc = subprocess.run(
            [sys.executable, __file__, "--one", "--model", spec, *keep],
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": str(ns.threads), "TOKENIZERS_PARALLELISM": "false"},
        )
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit(f"{spec}: the measuring process failed (exit status {proc.returncode})")
        results.append(json.loads(line.removeprefix("RESULT ")))
        print(f"{spec}: done in {results[-1]['wall_seconds']:.0f} s", flush=True)
    report = {
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_threads": ns.threads,
            "platform": platform.platform(),
            "torch": torch.__version__,
            "loadavg_at_end": os.getloadavg(),
        },
        "settings": {k: v for k, v in vars(ns).items() if k not in ("model", "one", "output")},
        "results": results,
    }
    out = Path(ns.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(_table(results))
    print(f"-> {out}")
    return results


if __name__ == "__main__":
    main()
