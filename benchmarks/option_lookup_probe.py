"""Can a policy model learn to read an enumerated option list whose order changes? (the option-lookup probe)

Single-prompt action enumeration asks the policy to find, in the ``# Options:`` block, the option its reflection
names and answer with that option's label. On DangerousTaxi the six options always come in the same order, so the
label of "north" is a fixed fact; in TextWorld and AutoExplore the list changes with every state, so answering is an
in-context lookup. This probe rewrites a policy SFT dataset (``policy_reflect.jsonl`` of ``reflect-trl data``: the
oracle's reflections) into variants, runs ``reflect-trl sft`` on each and prints the option accuracy on the data's
``validation`` rows with its chance level:

* ``keep``: the rows as written (the environment's option order);
* ``shuffle``: every row's options shuffled once (``validation`` rows too), the label moved with its option;
* ``augment``: the rows as written plus ``--copies`` shuffled copies of each ``train`` row (``validation`` as written);
* ``shuffle_copies``: ``--copies`` shuffled copies of each ``train`` row, every ``validation`` row shuffled once;
* ``no_state``: the reflection and shuffled options only (``--copies`` per ``train`` row): the bare lookup, as
  ``reflect-trl lookup-data`` writes it (:func:`reflect_trl.data.lookup.lookup_rows`).

::

    python benchmarks/option_lookup_probe.py outputs/demo/data/taxi/policy_reflect.jsonl \
        --model outputs/demo/models/tiny-llama --variants keep shuffle --steps 400
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

from reflect_trl.data.lookup import lookup_rows
from reflect_trl.prompts import ACTION_CUE, DEFAULT_LABELS, OPTIONS_HEADER, prompt_options

VARIANTS = ("keep", "shuffle", "augment", "shuffle_copies", "no_state")


def split_prompt(prompt: str) -> tuple[str, list[str], str]:
    """(text before the options block, the options' texts, text after the action cue)."""
    head, rest = prompt.rsplit(OPTIONS_HEADER, 1)
    return head, list(prompt_options(prompt)), rest.split(ACTION_CUE, 1)[1]


def render(head: str, options: list[str], tail: str) -> str:
    lines = "".join(f"{DEFAULT_LABELS[i]}. {text}\n" for i, text in enumerate(options))
    return head + OPTIONS_HEADER + lines + ACTION_CUE + tail


def shuffled_row(row: dict, head: str, options: list[str], tail: str, rng: random.Random) -> dict:
    """``row`` with its options in a random order and its target label moved with its option."""
    target = options[DEFAULT_LABELS.index(row["completion"])]
    order = options[:]
    rng.shuffle(order)
    return dict(row, prompt=render(head, order, tail), completion=DEFAULT_LABELS[order.index(target)])


def variant_rows(rows: list[dict], variant: str, copies: int, seed: int) -> dict[str, list[dict]]:
    """The rows of one variant, by split."""
    out: dict[str, list[dict]] = {"train": [], "validation": []}
    if variant == "no_state":  # the bare lookup: the library's option-lookup warm-up rows
        return {**out, **lookup_rows(rows, copies, seed)}
    rng = random.Random(seed)
    for row in rows:
        head, options, tail = split_prompt(row["prompt"])
        rows_of_split = out[row["split"]]
        n_shuffled = copies if row["split"] == "train" else 1
        if variant == "keep":
            rows_of_split.append(dict(row, prompt=render(head, options, tail)))
        elif variant == "shuffle":
            rows_of_split.append(shuffled_row(row, head, options, tail, rng))
        elif variant == "shuffle_copies":
            rows_of_split.extend(shuffled_row(row, head, options, tail, rng) for _ in range(n_shuffled))
        else:  # augment
            rows_of_split.append(dict(row, prompt=render(head, options, tail)))
            if row["split"] == "train":
                rows_of_split.extend(shuffled_row(row, head, options, tail, rng) for _ in range(copies))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "data", help="a policy_reflect.jsonl of `reflect-trl data` (with train and validation rows)"
    )
    parser.add_argument("--model", required=True, help="the model to fine-tune (a folder or hub id)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument(
        "--copies",
        type=int,
        default=8,
        help="shuffled copies per train row (augment, shuffle_copies, no_state)",
    )
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--output_dir", default="outputs/option_lookup_probe")
    parser.add_argument("--seed", type=int, default=0)
    parser.epilog = "Arguments after a lone -- go to every `reflect-trl sft` run (e.g. -- --use_peft true)."
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser.parse_args(argv[:cut]), argv[cut + 1 :]

    from datasets import Dataset, DatasetDict

    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    validation = [r for r in rows if r["split"] == "validation"]
    if not validation:
        sys.exit(f"{args.data}: no validation rows to measure the option accuracy on")
    chance = sum(1 / r["num_options"] for r in validation) / len(validation)
    results = []
    for variant in args.variants:
        folder = Path(args.output_dir) / variant
        splits = variant_rows(rows, variant, args.copies, args.seed)
        DatasetDict({name: Dataset.from_list(v) for name, v in splits.items()}).save_to_disk(
            str(folder / "data")
        )
        command = [
            sys.executable, "-m", "reflect_trl.cli", "sft", "--role", "policy",
            "--model_name_or_path", args.model, "--dataset_path", str(folder / "data"),
            "--eval_dataset_path", str(folder / "data"), "--output_dir", str(folder / "run"),
            "--max_steps", str(args.steps), "--learning_rate", str(args.learning_rate),
            "--per_device_train_batch_size", "16", "--lr_scheduler_type", "cosine", "--warmup_steps", "20",
            "--use_cpu", "true", "--save_strategy", "no", "--report_to", "none", "--logging_steps", "100",
            "--seed", str(args.seed), *extra,
        ]  # fmt: skip
        print(f"[probe] {variant}: {len(splits['train'])} train rows, sft {args.steps} steps", flush=True)
        with open(folder / "sft.log", "w") as log:
            if subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
                sys.exit(f"[probe] the sft run of variant {variant!r} failed: see {folder / 'sft.log'}")
        metrics = json.loads((folder / "run" / "sft_metrics.json").read_text())
        results.append(
            (variant, len(splits["train"]), metrics["eval_option_accuracy"], metrics["eval_option_nll"])
        )
    print(f"\n| variant | train rows | option accuracy | option NLL |  (chance {100 * chance:.1f} %)")
    print("|---|---:|---:|---:|")
    for variant, n, accuracy, nll in results:
        print(f"| {variant} | {n} | {100 * accuracy:.1f} % | {nll:.2f} |")


if __name__ == "__main__":
    main()
