"""The training forwards with and without the shared prompt prefix (docs/performance.md, "Training forwards").

Times the trainers' own code paths on real DangerousTaxi prompts of one policy checkpoint, each setting on the same
batches, one torch thread, medians of ``--repeats`` after a warm-up:

* RL: ``ReflectPPOTrainer._option_scores`` — a no-grad scoring forward (old / reference log-probs) and the loss
  forward + backward — over micro-batches of ``--batch_size`` turn prompts of one curriculum stage;
* SFT: ``ReflectSFTTrainer.compute_loss`` forward + backward on the policy and the reflection SFT data, batches of
  ``--batch_size`` rows drawn from all stages (as the SFT runs draw them);

with ``shared_prefix_min_tokens`` 16 (the default: the shared prefix in RL, the trained tails in SFT — "shared prefix"
in the report) and 0 (plain left- / right-padded forwards), and the largest difference of the results (log-probs,
losses, gradients) between the two.

    .venv/bin/python benchmarks/training_forwards.py --seed_dir outputs/reproduce/taxi/seed_0 \
        --output outputs/bench/training_forwards.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from reflect_trl.batching import left_pad
from reflect_trl.envs import make_env
from reflect_trl.models import load_causal_lm, load_tokenizer
from reflect_trl.trainers.rl_config import ReflectPPOConfig
from reflect_trl.trainers.rl_tasks import tasks_to_dataset
from reflect_trl.trainers.rl_trainer import ReflectPPOTrainer
from reflect_trl.trainers.sft_config import ReflectSFTConfig
from reflect_trl.trainers.sft_trainer import ReflectSFTTrainer

SETTINGS = {"shared prefix": 16, "plain": 0}


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _rows(path: Path, n: int, stage: str | None = None) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if stage is not None:
        rows = [r for r in rows if r.get("difficulty") == stage]
    if len(rows) < n:
        raise SystemExit(f"{path}: {len(rows)} rows{f' of stage {stage}' if stage else ''}, need {n}")
    return rows[:n]


def rl_forwards(model_dir: Path, data: Path, batch_size: int, repeats: int, out: Path) -> dict[str, Any]:
    """Scoring forward and loss forward + backward of ``ReflectPPOTrainer`` on ``batch_size`` `full` prompts."""
    tokenizer = load_tokenizer(str(model_dir))
    rows = _rows(data, batch_size, stage="full")
    ids, mask = left_pad([tokenizer(r["prompt"])["input_ids"] for r in rows], tokenizer.pad_token_id)
    num_options = torch.tensor([r["num_options"] for r in rows])
    option = torch.tensor([r["option_index"] for r in rows])
    tasks = make_env("taxi").make_tasks("train", 2, seed=0, difficulty="full")
    trainer = ReflectPPOTrainer(
        model=load_causal_lm(str(model_dir)),
        args=ReflectPPOConfig(
            output_dir=str(out),
            use_cpu=True,
            bf16=False,
            report_to="none",
            per_device_train_batch_size=batch_size,
            max_steps=1,
        ),
        train_dataset=tasks_to_dataset(tasks),
        processing_class=tokenizer,
    )
    model = trainer.model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    result: dict[str, Any] = {"prompt_tokens_mean": float(mask.sum(-1).float().mean()), "settings": {}}
    outputs = {}
    batch = {"prompt_ids": ids, "prompt_mask": mask, "num_options": num_options}
    for name, min_tokens in SETTINGS.items():
        trainer.args.shared_prefix_min_tokens = min_tokens

        def chosen(table: torch.Tensor) -> torch.Tensor:
            return table.gather(-1, option[:, None]).squeeze(-1)

        def score():
            with torch.no_grad():
                return chosen(trainer._option_scores(model, batch).log_probs)

        def loss_backward():
            logp = chosen(trainer._option_scores(model, batch).log_probs)
            loss = -(logp.exp() * 0.1).sum()
            return torch.autograd.grad(loss, params)

        outputs[name] = (score(), loss_backward())
        result["settings"][name] = {
            "score_forward_ms": 1000 * _median_seconds(score, repeats),
            "loss_forward_backward_ms": 1000 * _median_seconds(loss_backward, repeats),
        }
    (logp_a, grads_a), (logp_b, grads_b) = outputs.values()
    result["max_logp_diff"] = float((logp_a - logp_b).abs().max())
    result["max_grad_diff"] = max(float((a - b).abs().max()) for a, b in zip(grads_a, grads_b, strict=True))
    return result


def sft_forwards(
    model_dir: Path, data: Path, role: str, batch_size: int, repeats: int, out: Path
) -> dict[str, Any]:
    """``ReflectSFTTrainer.compute_loss`` forward + backward on one batch of ``data`` (all stages mixed)."""
    from datasets import Dataset

    rows = _rows(data, 4 * batch_size)
    columns = ("prompt", "completion", "num_options") if role == "policy" else ("prompt", "completion")
    dataset = Dataset.from_list([{k: r[k] for k in columns} for r in rows])
    result: dict[str, Any] = {"settings": {}}
    losses = {}
    for name, min_tokens in SETTINGS.items():
        trainer = ReflectSFTTrainer(
            model=str(model_dir),
            args=ReflectSFTConfig(
                output_dir=str(out),
                role=role,
                use_cpu=True,
                bf16=False,
                report_to="none",
                per_device_train_batch_size=batch_size,
                shared_prefix_min_tokens=min_tokens,
                dataset_num_proc=None,
                seed=0,
            ),
            train_dataset=dataset,
            processing_class=load_tokenizer(str(model_dir)),
        )
        batch = next(iter(trainer.get_train_dataloader()))
        model = trainer.model.eval()  # no dropout: the two settings compute the same function

        def loss_backward(trainer=trainer, model=model, batch=batch):
            loss = trainer.compute_loss(model, dict(batch))
            loss.backward()
            model.zero_grad(set_to_none=True)
            return loss.detach()

        losses[name] = float(loss_backward())
        result["settings"][name] = {
            "loss_forward_backward_ms": 1000 * _median_seconds(loss_backward, repeats)
        }
    result["tokens_per_row_mean"] = float(
        batch["attention_mask"].sum(-1).float().mean()
    )  # the same batch in both
    result["loss_diff"] = abs(losses["shared prefix"] - losses["plain"])
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seed_dir", default="outputs/reproduce/taxi/seed_0", help="a `make reproduce` seed folder"
    )
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--output", default="outputs/bench/training_forwards.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    seed_dir, out = Path(args.seed_dir), Path(args.output)
    data = seed_dir / "data" / "taxi"
    # the policy's SFT data with the SFT'd reflection model's reflections (relabelled), else the oracle's
    policy_data = next(
        p for p in (data / "policy_reflect_model.jsonl", data / "policy_reflect.jsonl") if p.is_file()
    )
    scratch = out.parent / "training_forwards_scratch"
    report = {
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(),
            "torch": torch.__version__,
        },
        "seed_dir": str(seed_dir),
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "rl": rl_forwards(
            seed_dir / "runs" / "sft_policy", policy_data, args.batch_size, args.repeats, scratch
        ),
        "sft_policy": sft_forwards(
            seed_dir / "models" / "tiny-llama",
            policy_data,
            "policy",
            args.batch_size,
            args.repeats,
            scratch,
        ),
        "sft_reflection": sft_forwards(
            seed_dir / "models" / "tiny-llama",
            data / "reflection.jsonl",
            "reflection",
            args.batch_size,
            args.repeats,
            scratch,
        ),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'forward':<42} {'shared prefix ms':>16} {'plain ms':>10} {'saved':>6}")
    for part, key in (
        ("rl", "score_forward_ms"),
        ("rl", "loss_forward_backward_ms"),
        ("sft_policy", "loss_forward_backward_ms"),
        ("sft_reflection", "loss_forward_backward_ms"),
    ):
        shared, plain = (report[part]["settings"][s][key] for s in SETTINGS)
        print(f"{part + ' ' + key:<42} {shared:>16.1f} {plain:>10.1f} {1 - shared / plain:>6.0%}")
    print(f"-> {out}")
    return report


if __name__ == "__main__":
    main()
