"""The frozen reflection model used in rollouts: one batched, KV-cached ``generate`` for all live episodes.

Generation stops per sequence at :data:`~reflect_trl.prompts.STOP_MARKER` (or EOS). When the marker is a
single token of the tokenizer it is passed as an extra EOS id (no string matching in the loop); otherwise
transformers' ``stop_strings`` handles it.

Where the time goes and what is done about it (measurements in ``docs/performance.md``):

* **Shared prompt prefix.** The prompts of one batch usually start with the same tokens (an environment's
  rules, legend and goal: 104 of the 180 tokens of a DangerousTaxi reflection prompt). That prefix is encoded
  once, at batch size 1, its keys/values are copied into every row of the batch's cache, and only the suffixes
  are prefilled. The batch is laid out as ``[shared prefix][left padding][suffix]``; position ids skip the
  padding, so every row sees exactly the positions and the context of its own unpadded prompt (the results
  equal plain left-padded generation up to float rounding).
* **Static KV cache.** The cache is preallocated for prompt + budget (transformers' ``StaticCache``) instead of
  concatenating the whole cache at every new token, which dominates a decode step of a small model at batch 32.
* The batch is padded directly into tensors (no ``tokenizer.pad``) and the ``generate`` arguments are built once.

The helpers :func:`left_pad`, :func:`position_ids_from_mask`, :func:`shared_prefix_length` and
:func:`prefix_kv_cache` are shared with the policy's forward pass in :mod:`reflect_trl.rollout`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from reflect_trl.prompts import STOP_MARKER, clean_reflection, encode_prompts

logger = logging.getLogger(__name__)

#: Shortest shared prefix (in tokens) worth encoding once for the whole batch.
DEFAULT_SHARED_PREFIX_MIN_TOKENS = 16
CACHE_IMPLEMENTATIONS = ("static", "dynamic")


@dataclass
class ReflectionBatch:
    """Reflections for a batch of prompts."""

    texts: list[str]  # cleaned reflection text (no marker)
    num_tokens: list[int]  # generated tokens up to and including the stop (or the budget)
    stopped: list[bool]  # True when the marker/EOS ended the reflection within the budget
    prompt_ids: list[list[int]]  # the tokenised prompts (without padding), reusable by the caller
    seconds: float = 0.0


# ------------------------------------------------------------------------------------------- batching helpers
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
    """Positions that ignore left padding (0 at each sequence's first real token)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


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


def stop_token_ids(tokenizer) -> list[int] | None:
    """Token ids that end a reflection: [marker, eos] when the marker is a single token, else None."""
    ids = tokenizer(STOP_MARKER, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        return None
    out = [ids[0]]
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in out:
        out.append(tokenizer.eos_token_id)
    return out


class ReflectionModel:
    """Wraps a causal LM as the frozen reflection player (eval mode, no gradients).

    ``shared_prefix_min_tokens`` (0 disables the shared-prefix encoding) and ``cache_implementation``
    (``"static"`` or ``"dynamic"``) only change speed, not results (up to float rounding). A model that cannot
    generate from a prebuilt cache makes the first call fall back, with a warning, to plain left-padded
    ``generate`` for good.
    """

    def __init__(
        self,
        model,
        tokenizer,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_prompt_length: int | None = None,
        shared_prefix_min_tokens: int = DEFAULT_SHARED_PREFIX_MIN_TOKENS,
        cache_implementation: str = "static",
    ) -> None:
        if cache_implementation not in CACHE_IMPLEMENTATIONS:
            raise ValueError(
                f"ReflectionModel: cache_implementation={cache_implementation!r}; choose one of {CACHE_IMPLEMENTATIONS}"
            )
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.max_prompt_length = max_prompt_length
        self.shared_prefix_min_tokens = shared_prefix_min_tokens
        self.cache_implementation = cache_implementation
        self._stop_ids = stop_token_ids(tokenizer)
        self._kwargs_key: tuple | None = None
        self._kwargs: dict | None = None
        self._fast_path_ok: bool | None = None  # None until the first fast-path call

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def tokenize(self, prompts: list[str]) -> list[list[int]]:
        # As SFT tokenized them (BOS included where the tokenizer adds one).
        ids = encode_prompts(self.tokenizer, prompts)
        if self.max_prompt_length:
            ids = [x[-self.max_prompt_length :] for x in ids]
        return ids

    def generation_kwargs(self) -> dict:
        """``generate`` keyword arguments of a reflection (rebuilt only when a sampling attribute changed)."""
        key = (self.max_new_tokens, self.temperature, self.top_p)
        if self._kwargs is None or key != self._kwargs_key:
            kwargs = dict(
                max_new_tokens=self.max_new_tokens, pad_token_id=self.tokenizer.pad_token_id, use_cache=True
            )
            if self.temperature > 0:
                kwargs.update(do_sample=True, temperature=self.temperature, top_p=self.top_p, top_k=0)
            else:
                kwargs.update(do_sample=False)
            if self._stop_ids is not None:
                kwargs["eos_token_id"] = self._stop_ids
            else:
                kwargs.update(stop_strings=[STOP_MARKER], tokenizer=self.tokenizer)
                if self.tokenizer.eos_token_id is not None:
                    kwargs["eos_token_id"] = self.tokenizer.eos_token_id
            self._kwargs, self._kwargs_key = kwargs, key
        return dict(self._kwargs)

    def _generate_ids(self, ids: list[list[int]]) -> torch.Tensor:
        """Generated token ids (B, <= max_new_tokens), through the fast path unless this model rejected it."""
        if self._fast_path_ok is False:
            return self._generate_with(ids, prefix=0, static_length=None)
        prefix = shared_prefix_length(ids, self.shared_prefix_min_tokens)
        # A single sequence has no large cache to re-concatenate: the dynamic cache is cheaper there.
        static_length = None
        if self.cache_implementation == "static" and len(ids) > 1:
            static_length = max(len(x) for x in ids) + self.max_new_tokens  # padded width + budget
        if not prefix and static_length is None:
            return self._generate_with(ids, prefix=0, static_length=None)
        try:
            out = self._generate_with(ids, prefix, static_length)
        except (ValueError, TypeError, NotImplementedError, AttributeError) as exc:
            if self._fast_path_ok:
                raise
            logger.warning(
                "ReflectionModel: %s cannot generate from a prebuilt (shared-prefix / static) KV cache (%s: %s); "
                "falling back to plain generate",
                type(self.model).__name__,
                type(exc).__name__,
                exc,
            )
            self._fast_path_ok = False
            return self._generate_with(ids, prefix=0, static_length=None)
        self._fast_path_ok = True
        return out

    def _generate_with(self, ids: list[list[int]], prefix: int, static_length: int | None) -> torch.Tensor:
        """One ``generate`` over the batch laid out for ``prefix``, from a prebuilt cache when asked."""
        input_ids, attention_mask = prefix_layout(ids, prefix, self.tokenizer.pad_token_id)
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        cache = None
        if prefix:
            cache = prefix_kv_cache(self.model, ids[0][:prefix], len(ids), static_length)
        elif static_length is not None:
            from transformers import StaticCache

            cache = StaticCache(config=self.model.config, max_cache_len=static_length)
        kwargs = self.generation_kwargs()
        if cache is not None:
            kwargs["cache"] = cache
        out = self.model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        return out[:, input_ids.shape[1] :]

    @torch.inference_mode()
    def generate(self, prompts: list[str], prompt_ids: list[list[int]] | None = None) -> ReflectionBatch:
        """Reflections for ``prompts`` (one batch, KV cache, per-sequence stop)."""
        start = time.perf_counter()
        if not prompts:
            return ReflectionBatch([], [], [], [])
        ids = prompt_ids if prompt_ids is not None else self.tokenize(prompts)
        new = self._generate_ids(ids)
        if self._stop_ids is not None:
            # Length up to and including the first stop token (the whole row when none).
            is_stop = torch.isin(new, torch.as_tensor(self._stop_ids, device=new.device))
            first = is_stop.int().argmax(dim=1)
            lengths = torch.where(is_stop.any(dim=1), first + 1, new.shape[1]).tolist()
        rows = new.tolist()
        if self._stop_ids is None:  # stop_strings pads the finished rows
            lengths = []
            for row in rows:
                n = len(row)
                while n and row[n - 1] == self.tokenizer.pad_token_id:
                    n -= 1
                lengths.append(n)
        texts, stopped = [], []
        eos = self.tokenizer.eos_token or "\0"
        for row, n in zip(rows, lengths, strict=True):
            raw = self.tokenizer.decode(row[:n], skip_special_tokens=False)
            did_stop = (
                self._stop_ids is not None and n and row[n - 1] in self._stop_ids
            ) or STOP_MARKER in raw
            texts.append(clean_reflection(raw.replace(eos, "")))
            stopped.append(bool(did_stop))
        return ReflectionBatch(texts, lengths, stopped, ids, time.perf_counter() - start)
