"""From played episodes to the tensors of one RL rollout batch: every turn becomes one row.

The path, top to bottom (``ReflectPPOTrainer._generate_and_score_completions``):

1. :func:`episode_rows` -- one :class:`TurnRow` per turn of every episode, with its advantage (``rl_math``) and, for
   ``gae``, its value target; :func:`replay_rows` adds replayed successful turns (constant advantage);
2. :func:`pad_rows` -- processes hold different numbers of turns, but GRPO's split into ``steps_per_generation``
   micro-batches and every collective need equal sizes: masked copies (``turn_mask`` 0) pad every process to the same
   multiple of ``steps_per_generation``;
3. :func:`collate` -- the rows as left-padded tensors (the keys the loss reads);
4. :func:`window_counts` -- per gradient-accumulation window of micro-batches, the counts the loss normalises by.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from reflect_trl.batching import left_pad
from reflect_trl.rl_math import ZERO_ADVANTAGE_TOL
from reflect_trl.rollout import Episode
from reflect_trl.trainers.replay import ReplayTurn


@dataclass(frozen=True)
class TurnRow:
    """One training sample: a turn prompt and the option taken, with what the loss needs of it."""

    prompt_ids: Sequence[int]
    option: int  # position of the chosen label in the prompt
    num_options: int
    advantage: float
    value_target: float = 0.0  # gae: R_t
    old_value: float = 0.0  # gae: V(s_t) at rollout time
    sampling_logp: float = float("nan")  # log pi_old(a|s) from the rollout; NaN for a stored (replayed) turn
    trains_value: bool = False  # on-policy turns of a gae run train the value head
    real: bool = True  # False: a padding row (no loss, no metrics)
    # train_reflection: the reflection's prompt and generated tokens (empty without a trained reflection)
    reflection_prompt_ids: Sequence[int] = ()
    reflection_ids: Sequence[int] = ()
    reflection_logps: Sequence[float] = ()
    #: the advantage of the reflection's tokens (``reflection_reward``; None: the turn's ``advantage``)
    reflection_advantage: float | None = None
    #: ``reflection_objective: oracle_sft``: the oracle reflector's text at this state, tokenized (the SFT target)
    teacher_ids: Sequence[int] = ()


def episode_rows(
    episodes: Sequence[Episode],
    advantages: Sequence[Sequence[float]],
    value_targets: Sequence[Sequence[float]] | None = None,
) -> list[TurnRow]:
    """One row per turn, in episode order; ``advantages[i][t]`` belongs to turn t of episode i."""
    rows = []
    for i, episode in enumerate(episodes):
        if len(advantages[i]) != len(episode.turns):
            raise ValueError(f"episode {i}: {len(episode.turns)} turns but {len(advantages[i])} advantages")
        for t, turn in enumerate(episode.turns):
            rows.append(
                TurnRow(
                    prompt_ids=turn.prompt_ids,
                    option=turn.option,
                    num_options=turn.num_options,
                    advantage=float(advantages[i][t]),
                    value_target=float(value_targets[i][t]) if value_targets is not None else 0.0,
                    old_value=turn.value or 0.0,
                    sampling_logp=turn.logprob,
                    trains_value=value_targets is not None,
                    reflection_prompt_ids=turn.reflection_prompt_ids,
                    reflection_ids=turn.reflection_ids,
                    reflection_logps=turn.reflection_logps,
                )
            )
    return rows


def with_advantages(rows: Sequence[TurnRow], advantages: Sequence[float]) -> list[TurnRow]:
    """``rows`` with their advantages replaced (e.g. after whitening)."""
    return [replace(r, advantage=float(a)) for r, a in zip(rows, advantages, strict=True)]


def replay_rows(turns: Sequence[ReplayTurn], advantage: float) -> list[TurnRow]:
    """Rows for replayed successful turns: a constant advantage, no value target, the old log-prob rescored."""
    return [TurnRow(t.prompt_ids, t.option, t.num_options, advantage) for t in turns]


def pad_rows(rows: Sequence[TurnRow], target: int, multiple: int) -> list[TurnRow]:
    """``rows`` padded with masked copies of the first row to ``target`` rounded up to a multiple of ``multiple``."""
    size = -(-target // multiple) * multiple
    filler = replace(rows[0], advantage=0.0, reflection_advantage=0.0, trains_value=False, real=False)
    return list(rows) + [filler] * (size - len(rows))


def collate(rows: Sequence[TurnRow], pad_id: int, device: torch.device | str) -> dict[str, Any]:
    """The batch tensors of ``rows``: ``prompt_ids`` / ``prompt_mask`` (left padded), ``option``, ``num_options``,
    ``advantages``, ``returns``, ``old_values``, ``sampling_logps``, ``turn_mask`` (real rows) and ``value_mask``
    (rows whose value head trains); with reflections, ``reflection_ids`` / ``reflection_mask`` (prompt + generated
    tokens, left padded), ``reflection_token_mask`` (the generated ones), ``old_reflection_logps`` and (a reward of
    the reflection's own) ``reflection_advantages``; with oracle targets, ``teacher_ids`` / ``teacher_mask`` / ``teacher_token_mask``."""

    def column(values: Sequence[float], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.tensor(list(values), dtype=dtype, device=device)

    prompt_ids, prompt_mask = left_pad([r.prompt_ids for r in rows], pad_id)
    batch: dict[str, Any] = {
        "prompt_ids": prompt_ids.to(device),
        "prompt_mask": prompt_mask.to(device),
        "option": column([r.option for r in rows], torch.long),
        "num_options": column([r.num_options for r in rows], torch.long),
        "advantages": column([r.advantage for r in rows]),
        "returns": column([r.value_target for r in rows]),
        "old_values": column([r.old_value for r in rows]),
        "sampling_logps": column([r.sampling_logp for r in rows]),
        "turn_mask": column([1.0 if r.real else 0.0 for r in rows]),
        "value_mask": column([1.0 if r.trains_value and r.real else 0.0 for r in rows]),
    }
    if any(r.reflection_ids for r in rows):
        batch.update(collate_reflections(rows, pad_id, device))
        if any(
            r.reflection_advantage is not None for r in rows
        ):  # else the reflection learns from ``advantages``
            batch["reflection_advantages"] = column(
                [r.advantage if r.reflection_advantage is None else r.reflection_advantage for r in rows]
            )
    if any(r.teacher_ids for r in rows):
        batch.update(collate_teacher_targets(rows, pad_id, device))
    return batch


def collate_reflections(rows: Sequence[TurnRow], pad_id: int, device: torch.device | str) -> dict[str, Any]:
    """Left-padded ``reflection prompt + generated tokens`` per row, with the generated tokens' mask and rollout
    log-probs aligned on the same columns (a row without a reflection is all padding, its mask 0)."""
    sequences = [list(r.reflection_prompt_ids) + list(r.reflection_ids) for r in rows]
    ids, mask = left_pad([s or [pad_id] for s in sequences], pad_id)
    width = ids.shape[1]
    token_mask = torch.zeros(len(rows), width)
    old = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        n = len(r.reflection_ids)
        if n and r.real:
            token_mask[i, width - n :] = 1.0
            old[i, width - n :] = torch.tensor(list(r.reflection_logps), dtype=torch.float32)
    return {
        "reflection_ids": ids.to(device),
        "reflection_mask": (mask if any(sequences) else torch.zeros_like(mask)).to(device),
        "reflection_token_mask": token_mask.to(device),
        "old_reflection_logps": old.to(device),
    }


def collate_teacher_targets(
    rows: Sequence[TurnRow], pad_id: int, device: torch.device | str
) -> dict[str, Any]:
    """Left-padded ``reflection prompt + oracle reflection tokens`` per row and the mask of the target tokens (the
    keys ``teacher_ids`` / ``teacher_mask`` / ``teacher_token_mask``)."""
    sequences = [list(r.reflection_prompt_ids) + list(r.teacher_ids) for r in rows]
    ids, mask = left_pad([s or [pad_id] for s in sequences], pad_id)
    width = ids.shape[1]
    token_mask = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        if r.teacher_ids and r.real:
            token_mask[i, width - len(r.teacher_ids) :] = 1.0
    return {
        "teacher_ids": ids.to(device),
        "teacher_mask": mask.to(device),
        "teacher_token_mask": token_mask.to(device),
    }


__all__ = ["TurnRow", "collate", "episode_rows", "pad_rows", "replay_rows", "with_advantages"]


def window_counts(windows: Sequence[Sequence[dict[str, Any]]]) -> torch.Tensor:
    """``[n_windows, 3]``: per window of micro-batches, its real turns, its value-trained turns and its turns with a
    learning signal -- a non-zero advantage of the policy or of the reflection, or an oracle target (this process's;
    the trainer sums them over processes in one collective)."""
    return torch.stack(
        [
            torch.stack(
                [
                    sum(c["turn_mask"].sum() for c in window),
                    sum(c["value_mask"].sum() for c in window),
                    sum((c["turn_mask"] * _has_signal(c)).sum() for c in window),
                ]
            )
            for window in windows
        ]
    )


def _has_signal(chunk: dict[str, Any]) -> torch.Tensor:
    """1 for each row of a micro-batch that carries a learning signal (see :func:`window_counts`)."""
    signal = chunk["advantages"].abs() > ZERO_ADVANTAGE_TOL
    if "reflection_advantages" in chunk:
        signal = signal | (chunk["reflection_advantages"].abs() > ZERO_ADVANTAGE_TOL)
    if "teacher_token_mask" in chunk:
        signal = signal | (chunk["teacher_token_mask"].sum(-1) > 0)
    return signal.float()
