"""Probe (DangerousTaxi only): policy SFT rows that teach the policy not to follow a reflection into a crash.

For every row of a relabelled policy data set (``reflect-trl relabel`` output: the SFT'd reflection model's greedy
reflections, oracle targets), the row's state is rebuilt by replaying the task and the actions listed in the prompt;
the reflection model then writes ``--samples`` reflections at ``--temperature``; each that recommends a move that
would crash in that state is added as a new row (same state, that reflection, the oracle target unchanged).

    .venv/bin/python benchmarks/crash_reflection_rows.py \
        --dataset outputs/reproduce/taxi/seed_0/data/taxi/policy_reflect_model \
        --reflection outputs/reproduce/taxi/seed_0/runs/sft_reflection \
        --output outputs/bench/policy_crash_rows --samples 4 --temperature 1.0

Writes a saved ``DatasetDict`` (every split: the original rows, then the added ones with ``reflection_source =
"model_crash"``) and copies the option labels recorded with the data, so ``reflect-trl sft --dataset_path`` reads it.
"""

from __future__ import annotations

import argparse
import copy
import shutil
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from reflect_trl.envs import Task, make_env  # noqa: E402
from reflect_trl.envs.taxi import ACTIONS  # noqa: E402
from reflect_trl.model_reflections import recommended_action, split_policy_prompt  # noqa: E402
from reflect_trl.models import load_causal_lm, load_tokenizer  # noqa: E402
from reflect_trl.prompts import LABELS_FILE, reflection_prompt, with_stop  # noqa: E402
from reflect_trl.reflection.model import ReflectionModel  # noqa: E402


def replay(row: dict):
    """The DangerousTaxi environment in the row's state: its task replayed with the actions its prompt lists."""
    env = make_env("taxi")
    env.reset(task=Task(env="taxi", task_id=row["task_id"], difficulty=row["difficulty"], seed=row["seed"]))
    history = row["prompt"].split("Actions so far: ", 1)[1].split(".\n", 1)[0].rstrip(".")
    if history != "none":
        for action in history.split(", "):
            env.step(ACTIONS.index(action))
    state, _, _ = split_policy_prompt(row["prompt"])
    if env.render() != state:
        raise ValueError(
            f"row {row['task_id']} step {row['step']}: replaying its actions does not give its state"
        )
    return env


def crash_rows(
    rows: list[dict], reflector: ReflectionModel, samples: int, batch_size: int = 64
) -> list[dict]:
    envs = [replay(r) for r in rows]
    parts = [split_policy_prompt(r["prompt"]) for r in rows]
    added = []
    for _ in range(samples):
        for start in range(0, len(rows), batch_size):
            chunk = range(start, min(start + batch_size, len(rows)))
            batch = reflector.generate([reflection_prompt(parts[i][0]) for i in chunk])
            for i, text in zip(chunk, batch.texts, strict=True):
                action = recommended_action(text, ACTIONS)
                if action is None or action == rows[i]["action_index"]:
                    continue
                if copy.deepcopy(envs[i]).step(action)[4]["crash"]:
                    state, _, options = parts[i]
                    prompt = reflection_prompt(state) + with_stop(text) + "\n" + options
                    added.append(
                        dict(
                            rows[i],
                            prompt=prompt,
                            reflection_source="model_crash",
                            reflection_names_action=False,
                        )
                    )
    return added


def main(argv: list[str] | None = None) -> dict:
    from datasets import Dataset, DatasetDict, load_from_disk

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="relabelled policy data (a saved DatasetDict)")
    parser.add_argument("--reflection", required=True, help="the SFT'd reflection model")
    parser.add_argument("--output", required=True)
    parser.add_argument("--samples", type=int, default=4, help="sampled reflections per row")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max_new_tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    reflector = ReflectionModel(
        load_causal_lm(args.reflection, trainable=False), load_tokenizer(args.reflection),
        max_new_tokens=args.max_new_tokens, temperature=args.temperature,
    )  # fmt: skip
    data = load_from_disk(args.dataset)
    out, stats = {}, {}
    for split in data:
        rows = [dict(r) for r in data[split]]
        added = crash_rows(rows, reflector, args.samples)
        stats[split] = {"rows": len(rows), "added": len(added)}
        print(
            f"[crash-rows] {split}: {len(rows)} rows + {len(added)} with a reflection that recommends a crash"
        )
        out[split] = Dataset.from_list(rows + added)
    DatasetDict(out).save_to_disk(args.output)
    labels = Path(args.dataset).parent / LABELS_FILE
    if labels.is_file():
        shutil.copy(labels, Path(args.output).parent / LABELS_FILE)
    return stats


if __name__ == "__main__":
    main()
