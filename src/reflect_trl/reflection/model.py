"""The frozen reflection model used in rollouts: one batched, KV-cached ``generate`` for all live episodes.

Generation stops per sequence at :data:`~reflect_trl.prompts.STOP_MARKER` (or EOS). When the marker is a
single token of the tokenizer it is passed as an extra EOS id (no string matching in the loop); otherwise
transformers' ``stop_strings`` handles it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reflect_trl.prompts import STOP_MARKER, clean_reflection


@dataclass
class ReflectionBatch:
    """Reflections for a batch of prompts."""

    texts: list[str]  # cleaned reflection text (no marker)
    num_tokens: list[int]  # generated tokens up to and including the stop (or the budget)
    stopped: list[bool]  # True when the marker/EOS ended the reflection within the budget
    prompt_ids: list[list[int]]  # the tokenised prompts (without padding), reusable by the caller
    seconds: float = 0.0


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
    """Wraps a causal LM as the frozen reflection player (eval mode, no gradients)."""

    def __init__(
        self,
        model,
        tokenizer,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_prompt_length: int | None = None,
    ) -> None:
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
        self._stop_ids = stop_token_ids(tokenizer)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def tokenize(self, prompts: list[str]) -> list[list[int]]:
        ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        if self.max_prompt_length:
            ids = [x[-self.max_prompt_length :] for x in ids]
        return ids

    @torch.inference_mode()
    def generate(self, prompts: list[str], prompt_ids: list[list[int]] | None = None) -> ReflectionBatch:
        """Reflections for ``prompts`` (left-padded batch, KV cache, per-sequence stop)."""
        import time

        start = time.perf_counter()
        if not prompts:
            return ReflectionBatch([], [], [], [])
        ids = prompt_ids if prompt_ids is not None else self.tokenize(prompts)
        batch = self.tokenizer.pad({"input_ids": ids}, padding=True, return_tensors="pt")
        input_ids = batch["input_ids"].to(self.device)
        attention_mask = batch["attention_mask"].to(self.device)
        kwargs = dict(
            max_new_tokens=self.max_new_tokens,
            pad_token_id=self.tokenizer.pad_token_id,
            use_cache=True,
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
        out = self.model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        new = out[:, input_ids.shape[1] :].tolist()
        texts, counts, stopped = [], [], []
        pad = self.tokenizer.pad_token_id
        for row in new:
            n = len(row)
            if self._stop_ids is not None:
                hit = next((i for i, t in enumerate(row) if t in self._stop_ids), None)
                if hit is not None:
                    n = hit + 1
            else:
                while n and row[n - 1] == pad:
                    n -= 1
            raw = self.tokenizer.decode(row[:n], skip_special_tokens=False)
            did_stop = (
                self._stop_ids is not None and n and row[n - 1] in self._stop_ids
            ) or STOP_MARKER in raw
            texts.append(clean_reflection(raw.replace(self.tokenizer.eos_token or "\0", "")))
            counts.append(n)
            stopped.append(bool(did_stop))
        return ReflectionBatch(texts, counts, stopped, ids, time.perf_counter() - start)
