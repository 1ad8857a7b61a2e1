"""Option-lookup warm-up data: the bare skill a policy needs when its option list changes from state to state.

Single-prompt action enumeration asks the policy to find, in the ``# Options:`` block, the option its reflection names
and to answer with that option's label. Where the list is the same at every state (DangerousTaxi) the label of a move
is a fixed fact; where it changes (TextWorld, AutoExplore) answering is an in-context lookup. The tiny self-built
models did not learn it from the policy rows themselves, but did from the *bare* lookup -- the reflection and the
shuffled options, no state -- and then carried it over to the full rows (measured with
``benchmarks/option_lookup_probe.py``: docs/studies/2026-12-07_textworld_settings.md).

:func:`lookup_rows` turns policy rows with reflections into such rows: ``# Reflection:`` + reflection + the row's options
in a seeded random order, the target label moved with its option; ``copies`` shuffled rows per ``train`` row, one per
row of any other split. ``reflect-trl lookup-data --dataset data/<env>/policy_reflect.jsonl --output
data/<env>/policy_lookup`` writes them like the data builder (``<output>/`` + ``<output>.jsonl``) for a first policy
SFT, whose model the policy SFT then starts from.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reflect_trl.data.io import SPLIT_COLUMN, available_splits, load_sft_dataset, write_jsonl
from reflect_trl.data.relabel import split_policy_prompt
from reflect_trl.prompts import (
    DEFAULT_LABELS,
    LABELS_FILE,
    REFLECTION_HEADER,
    STOP_MARKER,
    options_block,
    prompt_options,
    read_option_labels,
)


def lookup_rows(
    rows: Sequence[dict[str, Any]],
    copies: int = 8,
    seed: int = 0,
    labels: Sequence[str] = DEFAULT_LABELS,
) -> dict[str, list[dict[str, Any]]]:
    """The bare-lookup rows of policy rows with reflections (each with a ``split``), by split, in the rows' order:
    ``copies`` per ``train`` row, one per other row; one seeded generator draws every order."""
    if copies < 1:
        raise ValueError(f"copies must be >= 1, got {copies}")
    rng = random.Random(seed)
    out: dict[str, list[dict[str, Any]]] = {}
    for index, row in enumerate(rows):
        _, reflection, _ = split_policy_prompt(row["prompt"])
        options = list(prompt_options(row["prompt"]))
        completion = str(row["completion"]).strip()
        if completion not in labels[: len(options)]:
            raise ValueError(
                f"row {index} ({row.get(SPLIT_COLUMN, 'train')}): completion {row['completion']!r} is not one of the "
                f"{len(options)} option labels {list(labels[: len(options)])}"
            )
        target = options[list(labels).index(completion)]
        split = str(row.get(SPLIT_COLUMN, "train"))
        for _ in range(copies if split == "train" else 1):
            order = options[:]
            rng.shuffle(order)
            shown = tuple(labels[: len(order)])
            block = options_block(order, shown, range(len(order)))
            prompt = REFLECTION_HEADER + reflection + STOP_MARKER + "\n" + block
            out.setdefault(split, []).append(
                dict(
                    row,
                    prompt=prompt,
                    completion=shown[order.index(target)],
                    option_index=order.index(target),
                )
            )
    return out


def write_lookup_dataset(
    dataset: str | Path, output: str | Path, copies: int = 8, seed: int = 0
) -> dict[str, int]:
    """:func:`lookup_rows` of every split of ``dataset`` (a builder ``.jsonl`` or saved directory), saved as
    ``output/`` (``DatasetDict``) and ``output.jsonl``, with the data's labels file. Returns the rows per split."""
    from datasets import Dataset, DatasetDict

    source = Path(dataset)
    folder = source if source.is_dir() else source.parent
    labels = read_option_labels(folder) or DEFAULT_LABELS
    rows = [
        {SPLIT_COLUMN: split, **dict(r)}
        for split in (available_splits(dataset) or ["train"])
        for r in load_sft_dataset(dataset, split)
    ]
    by_split = lookup_rows(rows, copies, seed, labels)
    by_split = {
        split: [{k: v for k, v in r.items() if k != SPLIT_COLUMN} for r in rs]
        for split, rs in by_split.items()
    }
    output = Path(output)
    if output.exists():
        if not (output / "dataset_dict.json").is_file():
            raise FileExistsError(f"{output} exists and is not a saved data set; choose another --output")
        shutil.rmtree(output)
    DatasetDict({split: Dataset.from_list(rs) for split, rs in by_split.items()}).save_to_disk(str(output))
    write_jsonl(
        ({SPLIT_COLUMN: split, **r} for split, rs in by_split.items() for r in rs),
        output.parent / f"{output.name}.jsonl",
    )
    if (folder / LABELS_FILE).is_file() and (folder / LABELS_FILE).resolve() != (
        output.parent / LABELS_FILE
    ).resolve():
        shutil.copy(folder / LABELS_FILE, output.parent / LABELS_FILE)
    return {split: len(rs) for split, rs in by_split.items()}


__all__ = ["lookup_rows", "write_lookup_dataset"]
