"""The SFT anchor of RL: rows of the policy's SFT data trained alongside the RL loss (InstructGPT's PPO-ptx term).

Each rollout batch adds ``k`` rows drawn (seeded, with replacement) from the ``train`` split of a policy SFT data set
(the prompt/completion rows ``reflect-trl data`` writes: state + reflection + options, completion = the oracle's
option label). The trainer adds ``sft_anchor_coef * mean(-log pi(target option | prompt))`` over those rows to the
PPO loss (``rl_math.anchor_nll``), so decisions the SFT data supports stay pinned while RL moves the others.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reflect_trl.datasets_io import DatasetFormatError, load_sft_dataset
from reflect_trl.prompts import encode_truncated_prompts
from reflect_trl.replay import ReplayTurn, draw_with_replacement, restore_rng


def load_anchor_rows(
    path: str | Path,
    tokenizer,
    labels: Sequence[str],
    max_prompt_length: int | None = None,
) -> list[ReplayTurn]:
    """The ``train`` rows of a policy SFT data set as turns (``option`` = the target's position, return 0),
    tokenized as rollouts tokenize prompts.

    Every row needs ``prompt``, ``completion`` (one of ``labels``, surrounding spaces ignored) and ``num_options``
    (an int > the target's position); a row that lacks one raises :class:`DatasetFormatError` naming the data set,
    the row and the field."""
    dataset = load_sft_dataset(path, split="train")
    if "num_options" not in dataset.column_names:
        raise DatasetFormatError(
            f"{path}: sft_anchor_data needs a 'num_options' column (policy rows written by `reflect-trl data`); "
            f"columns present: {dataset.column_names}"
        )
    positions = {label: i for i, label in enumerate(labels)}
    options: list[int] = []
    counts: list[int] = []
    for row, (completion, num_options) in enumerate(
        zip(dataset["completion"], dataset["num_options"], strict=True)
    ):
        label = completion.strip()
        if label not in positions:
            raise DatasetFormatError(
                f"{path}, train row {row}: completion {completion!r} is not one of the policy's option labels "
                f"{list(labels)} (sft_anchor_data must be policy data, not reflection data)"
            )
        if not isinstance(num_options, int) or not positions[label] < num_options <= len(labels):
            raise DatasetFormatError(
                f"{path}, train row {row}: num_options={num_options!r} does not fit completion {label!r} and "
                f"{len(labels)} labels"
            )
        options.append(positions[label])
        counts.append(num_options)
    ids = encode_truncated_prompts(tokenizer, list(dataset["prompt"]), max_prompt_length)
    return [ReplayTurn(tuple(x), o, n, 0.0) for x, o, n in zip(ids, options, counts, strict=True)]


class AnchorSampler:
    """Seeded draws (with replacement) of anchor rows; its state is the generator's (rows are reloaded)."""

    def __init__(self, rows: list[ReplayTurn], seed: int) -> None:
        if not rows:
            raise ValueError("AnchorSampler needs at least one row")
        self.rows = rows
        self.rng = random.Random(seed)

    def sample(self, k: int) -> list[ReplayTurn]:
        return draw_with_replacement(self.rng, self.rows, k)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate(), "num_rows": len(self.rows)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["num_rows"] != len(self.rows):
            raise ValueError(
                f"the checkpoint's SFT anchor had {state['num_rows']} rows, sft_anchor_data now has {len(self.rows)}"
            )
        restore_rng(self.rng, state["rng"])


__all__ = ["AnchorSampler", "load_anchor_rows"]
