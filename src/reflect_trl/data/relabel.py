"""Policy SFT data that shows the policy the reflections it will actually read: the SFT'd reflection model's.

The data builder's policy rows carry the *oracle's* reflections, which always name the right action, so a policy
SFT'd on them learns to copy the action the reflection names. In the loop the frozen reflection model writes the
reflections, and where it is wrong the copying policy follows it into the mistake. This step rewrites a policy data
set: for every row, the reflection in the prompt is replaced by the reflection model's own reflection of the same
state (greedy, or sampled at ``temperature``); the target stays the oracle's action. With ``keep_oracle_rows`` the
original rows are kept too, so the policy sees each state once with a reliable reflection and once with the model's.
A policy trained on this learns when the reflection can be trusted, and keeps a signal that RL can refine.

``reflect-trl relabel --dataset data/taxi/policy_reflect.jsonl --reflection_model outputs/.../sft_reflection
--output data/taxi/policy_reflect_model`` writes ``<output>/`` (``DatasetDict``) and ``<output>.jsonl``, like the
data builder, and copies the labels file of the data directory.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reflect_trl.data.io import SPLIT_COLUMN, available_splits, load_sft_dataset, write_jsonl
from reflect_trl.prompts import (
    LABELS_FILE,
    OPTIONS_HEADER,
    REFLECTION_HEADER,
    STOP_MARKER,
    reflection_prompt,
    with_stop,
)

logger = logging.getLogger(__name__)


def split_policy_prompt(prompt: str) -> tuple[str, str, str]:
    """``(state text, reflection, options block)`` of a policy prompt built by ``prompts.build_prompt`` with a
    reflection; raises ValueError naming what is missing otherwise."""
    head, sep, rest = prompt.partition(REFLECTION_HEADER)
    if not sep:
        raise ValueError(
            f"not a policy prompt with a reflection (no {REFLECTION_HEADER!r}): {prompt[:80]!r}..."
        )
    reflection, sep, options = rest.partition(STOP_MARKER + "\n")
    if not sep or not options.startswith(OPTIONS_HEADER):
        raise ValueError(
            f"policy prompt without '<reflection>{STOP_MARKER}' + options block: ...{rest[:80]!r}"
        )
    return head.rstrip("\n"), reflection, options


def relabel_rows(
    rows: Sequence[dict[str, Any]], reflection_model, batch_size: int = 64, keep_oracle_rows: bool = True
) -> list[dict[str, Any]]:
    """Rows whose prompt carries ``reflection_model``'s reflection (a :class:`ReflectionModel`, or anything with
    its ``generate``), targets unchanged; the oracle rows first when ``keep_oracle_rows``. Each new row gets
    ``reflection_source = "model"`` (the kept ones ``"oracle"``) and ``reflection_names_action`` (whether the model's
    reflection quotes the target action's text)."""
    parts = [split_policy_prompt(r["prompt"]) for r in rows]
    out = (
        [dict(r, reflection_source="oracle", reflection_names_action=True) for r in rows]
        if keep_oracle_rows
        else []
    )
    for start in range(0, len(rows), batch_size):
        chunk = parts[start : start + batch_size]
        batch = reflection_model.generate([reflection_prompt(state) for state, _, _ in chunk])
        for row, (state, _, options), text in zip(
            rows[start : start + batch_size], chunk, batch.texts, strict=True
        ):
            prompt = reflection_prompt(state) + with_stop(text) + "\n" + options
            named = bool(row.get("action_text")) and str(row["action_text"]) in text
            out.append(dict(row, prompt=prompt, reflection_source="model", reflection_names_action=named))
    return out


def relabel_dataset(
    dataset: str | Path,
    reflection_model_path: str | Path,
    output: str | Path,
    temperature: float = 0.0,
    max_new_tokens: int = 64,
    keep_oracle_rows: bool = True,
    seed: int = 0,
    batch_size: int = 64,
) -> dict[str, Any]:
    """Relabel every split of ``dataset`` (a builder ``.jsonl`` or saved directory); save ``output/`` and
    ``output.jsonl``. Returns per-split statistics (rows, share of model reflections that name the target)."""
    import torch
    from datasets import Dataset, DatasetDict

    from reflect_trl.models import load_causal_lm, load_tokenizer
    from reflect_trl.reflection.model import ReflectionModel

    splits = available_splits(dataset) or ["train"]
    model = load_causal_lm(str(reflection_model_path), trainable=False, merge_adapter=True)
    reflector = ReflectionModel(
        model,
        load_tokenizer(str(reflection_model_path)),
        max_new_tokens=max_new_tokens,
        temperature=temperature,
    )
    torch.manual_seed(seed)
    rows_by_split: dict[str, list[dict[str, Any]]] = {}
    stats: dict[str, Any] = {}
    for split in splits:
        rows = [dict(r) for r in load_sft_dataset(dataset, split)]
        new = relabel_rows(rows, reflector, batch_size, keep_oracle_rows)
        rows_by_split[split] = new
        model_rows = [r for r in new if r["reflection_source"] == "model"]
        stats[split] = {
            "rows": len(new),
            "model_rows": len(model_rows),
            "model_reflection_names_target": sum(r["reflection_names_action"] for r in model_rows)
            / max(len(model_rows), 1),
        }
        logger.info("relabel %s: %s", split, stats[split])
    output = Path(output)
    if output.exists():
        if not (output / "dataset_dict.json").is_file():
            raise FileExistsError(f"{output} exists and is not a saved data set; choose another --output")
        shutil.rmtree(output)
    DatasetDict({split: Dataset.from_list(rows) for split, rows in rows_by_split.items()}).save_to_disk(
        str(output)
    )
    write_jsonl(
        ({SPLIT_COLUMN: split, **row} for split, rows in rows_by_split.items() for row in rows),
        output.parent / f"{output.name}.jsonl",  # not with_suffix: "data_T0.7" keeps its ".7"
    )
    labels = Path(dataset).parent / LABELS_FILE  # data/<env>/<name>(.jsonl) -> data/<env>/LABELS_FILE
    if labels.is_file() and labels.resolve() != (output.parent / LABELS_FILE).resolve():
        shutil.copy(labels, output.parent / LABELS_FILE)
    return stats


__all__ = ["relabel_dataset", "relabel_rows", "split_policy_prompt"]
