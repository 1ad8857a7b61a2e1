"""SFT evaluation metrics beyond the loss, as weighted sums so that the shards of several processes can be added.

* policy: ``option_accuracy`` (argmax of the option-restricted head over the offered options against the oracle
  label) and ``option_nll`` (mean negative log-probability of the oracle label);
* reflection: generated through :class:`~reflect_trl.reflection.model.ReflectionModel`, the same path as the RL
  rollouts: ``stop_rate`` (reflections that stopped, on the stop marker or EOS, within the token budget: the
  ``stopped`` of a rollout's ``reflection_stop_rate``), ``reflection_length`` (generated tokens up to and
  including the stop, or the budget), ``reflection_exact_match`` (stopped and equal to the reference) and
  ``reflection_names_action`` (the reflection contains the oracle action's text: a proxy for whether it plans the
  right move).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from reflect_trl.action_head import OptionHead
from reflect_trl.prompts import DEFAULT_LABELS, clean_reflection, encode_truncated_prompts
from reflect_trl.reflection.model import ReflectionModel


def spread_indices(n: int, k: int) -> list[int]:
    """``min(n, k)`` distinct row indices spread evenly over ``range(n)`` (deterministic)."""
    if k <= 0 or n <= 0:
        return []
    if k >= n:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)}) if k > 1 else [0]


def strip_eos(text: str, eos: str | None) -> str:
    """``text`` without a trailing EOS token string."""
    return text[: -len(eos)] if eos and text.endswith(eos) else text


@torch.no_grad()
def policy_option_metrics(
    model,
    tokenizer,
    prompts: Sequence[str],
    target_options: Sequence[int],
    num_options: Sequence[int],
    labels: Sequence[str] = DEFAULT_LABELS,
    batch_size: int = 16,
    max_length: int | None = None,
    weights: Sequence[float] | None = None,
) -> dict[str, float]:
    """Option accuracy (argmax over the offered options of the option-restricted head) and NLL of the target
    option, as weighted sums ``correct``, ``nll``, ``count``."""
    weights = list(weights) if weights is not None else [1.0] * len(prompts)
    if not prompts:
        return {"correct": 0.0, "nll": 0.0, "count": 0.0}
    head = OptionHead(tokenizer, labels[: max(num_options)])
    device = next(model.parameters()).device
    correct = nll = count = 0.0
    for start in range(0, len(prompts), batch_size):
        stop = start + batch_size
        sequences = encode_truncated_prompts(tokenizer, prompts[start:stop], max_length)
        log_probs = head.forward(model, sequences, num_options[start:stop]).log_probs
        target = torch.tensor(target_options[start:stop], device=device)
        weight = torch.tensor(weights[start:stop], device=device, dtype=torch.float)
        correct += float(((log_probs.argmax(-1) == target).float() * weight).sum())
        nll += float((-log_probs.gather(1, target[:, None]).squeeze(1) * weight).sum())
        count += float(weight.sum())
    return {"correct": correct, "nll": nll, "count": count}


def reflection_generation_metrics(
    reflection: ReflectionModel,
    prompts: Sequence[str],
    references: Sequence[str],
    batch_size: int = 16,
    weights: Sequence[float] | None = None,
    action_texts: Sequence[str] | None = None,
) -> dict[str, float]:
    """Generate a reflection per prompt with ``reflection`` and score it (see the module docstring); given
    ``action_texts`` (the oracle action of each row), also count reflections that name it. Weighted sums
    ``stopped``, ``length``, ``exact``, ``names_action``, ``count``."""
    weights = list(weights) if weights is not None else [1.0] * len(prompts)
    totals = {"stopped": 0.0, "length": 0.0, "exact": 0.0, "names_action": 0.0, "count": 0.0}
    for start in range(0, len(prompts), batch_size):
        batch = reflection.generate(list(prompts[start : start + batch_size]))
        for i, (text, length, stopped) in enumerate(
            zip(batch.texts, batch.num_tokens, batch.stopped, strict=True), start=start
        ):
            weight = weights[i]
            totals["stopped"] += weight * stopped
            totals["length"] += weight * length
            totals["exact"] += weight * (stopped and text == clean_reflection(references[i]))
            if action_texts is not None:
                totals["names_action"] += weight * (action_texts[i] in text)
            totals["count"] += weight
    return totals


__all__ = [
    "encode_truncated_prompts",
    "policy_option_metrics",
    "reflection_generation_metrics",
    "spread_indices",
    "strip_eos",
]
