"""Batching helpers shared by every forward pass and ``generate`` over prompts of different lengths.

Prompts are **left-padded** (the last prompt token of every row sits in the last column, where the option head
and ``generate`` read), and positions are computed from the attention mask so that padding never shifts a row's
positions (absolute position embeddings, GPT-2). Prompts of one batch that share a long token prefix can be laid
out as ``[shared prefix][left padding][suffix]``: the prefix is encoded once at batch size 1
(:func:`prefix_kv_cache`) and only the suffixes are run at full batch size; position ids that skip the padding give
every row exactly the positions and context of its own unpadded prompt.

Users: :mod:`reflect_trl.reflection.model` (reflection ``generate``), :mod:`reflect_trl.rollout` (the policy's
forward), :mod:`reflect_trl.action_head`, the SFT metrics and the RL trainer.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

#: Shortest shared prefix (in tokens) worth encoding once for the whole batch.
DEFAULT_SHARED_PREFIX_MIN_TOKENS = 16


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of left-padded sequences."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        if len(s):
            ids[i, width - len(s) :] = torch.as_tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids, mask


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that ignore left padding (0 at each sequence's first real token; padding gets 0 too)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def unpad_left(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """The token lists of a left-padded batch (the inverse of :func:`left_pad`)."""
    ids, mask = input_ids.cpu(), attention_mask.cpu().bool()
    return [row[keep].tolist() for row, keep in zip(ids, mask, strict=True)]


def shared_prefix_length(sequences: Sequence[Sequence[int]], min_tokens: int) -> int:
    """Length of the token prefix common to all ``sequences`` (at least 2 of them), or 0 when shorter than
    ``min_tokens``. Every sequence keeps at least one token after the prefix."""
    if len(sequences) < 2 or min_tokens <= 0:
        return 0
    common = len(os.path.commonprefix([list(s) for s in sequences]))
    common = min(common, min(len(s) for s in sequences) - 1)
    return common if common >= min_tokens else 0


def prefix_layout(
    sequences: Sequence[Sequence[int]], prefix_length: int, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) laid out as ``[shared prefix][left padding][suffix]`` (plain left padding
    when ``prefix_length`` is 0)."""
    if not prefix_length:
        return left_pad(sequences, pad_id)
    suffix_ids, suffix_mask = left_pad([s[prefix_length:] for s in sequences], pad_id)
    prefix = torch.as_tensor(list(sequences[0][:prefix_length]), dtype=torch.long).expand(len(sequences), -1)
    ids = torch.cat([prefix, suffix_ids], dim=1)
    mask = torch.cat([torch.ones_like(prefix), suffix_mask], dim=1)
    return ids, mask


def prefix_kv_cache(model, prefix_ids: Sequence[int], batch_size: int, static_length: int | None = None):
    """A KV cache holding ``prefix_ids`` for each of ``batch_size`` rows, computed by one batch-1 forward.

    ``static_length`` set: a preallocated ``StaticCache`` of that many positions; else a ``DynamicCache``."""
    from transformers import StaticCache

    device = next(model.parameters()).device
    ids = torch.as_tensor([list(prefix_ids)], dtype=torch.long, device=device)
    encoded = model(
        input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True, logits_to_keep=1
    ).cache
    if static_length is None:
        encoded.batch_repeat_interleave(batch_size)
        return encoded
    cache = StaticCache(config=model.config, max_cache_len=static_length)
    for layer_idx, layer in enumerate(encoded.layers):
        cache.update(
            layer.keys.expand(batch_size, -1, -1, -1), layer.values.expand(batch_size, -1, -1, -1), layer_idx
        )
    return cache


def _prefix_layout_forward(
    model, sequences: Sequence[Sequence[int]], prefix_length: int, pad_id: int, **kwargs
):
    """(outputs, attention_mask) of :func:`shared_prefix_forward`."""
    device = next(model.parameters()).device
    input_ids, attention_mask = prefix_layout(sequences, prefix_length, pad_id)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    position_ids = position_ids_from_mask(attention_mask)
    cache = prefix_kv_cache(model, sequences[0][:prefix_length], len(sequences)) if prefix_length else None
    outputs = model(
        input_ids=input_ids[:, prefix_length:],
        attention_mask=attention_mask,
        position_ids=position_ids[:, prefix_length:],
        cache=cache,
        use_cache=True,
        **kwargs,
    )
    return outputs, attention_mask


def shared_prefix_forward(
    model, sequences: Sequence[Sequence[int]], prefix_length: int, pad_id: int, **kwargs
):
    """One forward of ``model`` over ``sequences`` whose first ``prefix_length`` tokens are common: the prefix is
    encoded once at batch size 1 (:func:`prefix_kv_cache`; gradients flow through it when enabled) and only the
    left-padded suffixes run at full batch size, with the positions and attention of the whole rows (``prefix_length``
    0: a plain left-padded forward). ``kwargs`` go to the suffix forward (e.g. ``logits_to_keep``,
    ``output_hidden_states``)."""
    return _prefix_layout_forward(model, sequences, prefix_length, pad_id, **kwargs)[0]


def context_kv_cache(model, sequences: Sequence[Sequence[int]], prefix_length: int, pad_id: int):
    """(cache, attention_mask) of ``sequences`` encoded as :func:`shared_prefix_forward` does (layout of
    :func:`prefix_layout`), so that a next forward with this cache and the mask extended by its own columns continues
    every row where it ended. Gradients flow through the cache when enabled; every sequence needs a token after the
    prefix."""
    encoded, attention_mask = _prefix_layout_forward(
        model, sequences, prefix_length, pad_id, logits_to_keep=1
    )
    return encoded.cache, attention_mask


def checkpointing_drops_cache(args, model) -> bool:
    """Whether activation checkpointing — asked for in the training ``args`` or already on in ``model`` — is active
    under autograd: it re-runs layers without their KV cache, so a prefix / context cache cannot be used."""
    checkpointing = (
        getattr(args, "activation_checkpointing", None)
        or getattr(args, "gradient_checkpointing", None)
        or getattr(model, "is_gradient_checkpointing", False)
    )
    return bool(checkpointing) and torch.is_grad_enabled()


__all__ = [
    "DEFAULT_SHARED_PREFIX_MIN_TOKENS",
    "checkpointing_drops_cache",
    "context_kv_cache",
    "left_pad",
    "position_ids_from_mask",
    "prefix_kv_cache",
    "prefix_layout",
    "shared_prefix_forward",
    "shared_prefix_length",
    "unpad_left",
]
