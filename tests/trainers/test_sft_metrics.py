"""SFT metrics on models whose outputs are fixed: every value is known in advance."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from reflect_trl.prompts import DEFAULT_LABELS, label_token_ids
from reflect_trl.reflection.model import ReflectionBatch
from reflect_trl.trainers.sft_metrics import (
    policy_option_metrics,
    reflection_generation_metrics,
    spread_indices,
)

LABEL_SCORES = (0.0, 2.0, 1.0)  # logits of the tokens of A, B, C at the last position


class FixedLabelScores(torch.nn.Module):
    """A causal-LM stand-in: the last-position logits are the same for every prompt (A: 0, B: 2, C: 1, others -9)."""

    def __init__(self, tokenizer) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(()))
        row = torch.full((len(tokenizer),), -9.0)
        row[label_token_ids(tokenizer, DEFAULT_LABELS[:3])] = torch.tensor(LABEL_SCORES)
        self.register_buffer("row", row)

    def forward(self, input_ids, attention_mask=None, logits_to_keep=0, **_):
        assert attention_mask is not None and attention_mask.shape == input_ids.shape
        return SimpleNamespace(logits=self.row.expand(input_ids.shape[0], 1, -1))


def _nll(target: int, offered: int) -> float:
    scores = LABEL_SCORES[:offered]
    return -(scores[target] - math.log(sum(math.exp(s) for s in scores)))


def test_option_accuracy_and_nll_of_a_known_model(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = FixedLabelScores(tokenizer)
    # (target, offered, weight): with A, B, C offered the argmax is B; with A, B it is B; with A alone it is A.
    rows = [(1, 3, 1.0), (0, 3, 1.0), (0, 1, 1.0), (2, 3, 1.0), (1, 2, 1.0), (0, 3, 0.0)]
    prompts = [f"state {'x ' * i}\n# Action:\n" for i in range(len(rows))]  # different lengths: padding
    sums = policy_option_metrics(
        model,
        tokenizer,
        prompts,
        [t for t, _, _ in rows],
        [n for _, n, _ in rows],
        batch_size=4,
        weights=[w for _, _, w in rows],
    )
    assert sums["count"] == 5.0, "the zero-weight row is not counted"
    assert sums["correct"] == 3.0, "rows 0, 2 and 4 are right"
    expected_nll = _nll(1, 3) + _nll(0, 3) + 0.0 + _nll(2, 3) + _nll(1, 2)
    assert sums["nll"] == pytest.approx(expected_nll, rel=1e-6)


def test_reflection_metrics_of_fixed_generations():
    class FixedReflections:
        def __init__(self, batches: list[ReflectionBatch]) -> None:
            self.batches, self.calls = list(batches), []

        def generate(self, prompts):
            self.calls.append(list(prompts))
            return self.batches.pop(0)

    reflection = FixedReflections(
        [
            ReflectionBatch(
                ["go east now", "move north", "", "x"], [4, 30, 1, 2], [True, False, True, True], []
            ),
            ReflectionBatch(["move north"], [3], [True], []),
        ]
    )
    sums = reflection_generation_metrics(
        reflection,
        ["p0", "p1", "p2", "p3", "p4"],
        ["go east now<end>", "move north", "a", "b", "move north<end>"],
        batch_size=4,
        weights=[1.0, 1.0, 1.0, 1.0, 0.5],
        action_texts=["go east", "move north", "go east", "go west", "move north"],
    )
    assert reflection.calls == [["p0", "p1", "p2", "p3"], ["p4"]]
    assert sums == {
        "stopped": 3.5,  # rows 0, 2, 3 and half of row 4
        "length": 4 + 30 + 1 + 2 + 1.5,
        "exact": 1.5,  # row 0, half of row 4 (row 1 equals its reference but did not stop)
        "names_action": 2.5,  # rows 0, 1, half of row 4
        "count": 4.5,
    }


def test_spread_indices():
    assert spread_indices(10, 3) == [0, 4, 9] or spread_indices(10, 3) == [0, 5, 9]
    assert spread_indices(3, 10) == [0, 1, 2] and spread_indices(5, 0) == [] and spread_indices(5, 1) == [0]
