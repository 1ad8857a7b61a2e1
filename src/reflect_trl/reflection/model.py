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
* No compilation: ``generate`` would ``torch.compile`` the forward of a StaticCache run on CUDA, and recompile for the
  batch size and cache length of every turn; ``disable_compile`` keeps it eager.

The batch layout and the prefix cache come from :mod:`reflect_trl.batching` (shared with the policy's forward
pass in :mod:`reflect_trl.rollout`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from reflect_trl.batching import (
    DEFAULT_SHARED_PREFIX_MIN_TOKENS,
    prefix_kv_cache,
    prefix_layout,
    shared_prefix_length,
)
from reflect_trl.prompts import STOP_MARKER, clean_reflection, encode_prompts

logger = logging.getLogger(__name__)

CACHE_IMPLEMENTATIONS = ("static", "dynamic")

#: The logits processors a checkpoint's ``generation_config`` may switch on (chat checkpoints often set a repetition
#: penalty), each at the value that switches it off. ``generate`` fills every setting a call leaves unset from the
#: model's ``generation_config``, so these are passed explicitly: a reflection is drawn from the model's own
#: distribution at the configured temperature / top-p and nothing else -- the distribution a trained reflection
#: player's loss scores (``ReflectionLearner.token_logps``).
NEUTRAL_GENERATION: dict = {
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "min_new_tokens": 0,  # takes precedence over an inherited min_length too
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "guidance_scale": 1.0,
    "renormalize_logits": False,
    "remove_invalid_values": False,
    "num_beams": 1,
    "num_return_sequences": 1,
}
#: Switched off only by ``None``, which ``generate`` replaces with the model's value: the neutral value of each one
#: that has one, passed when the model sets it (sampling only).
NEUTRAL_WHEN_SET: dict = {"min_p": 0.0}
#: Processors a call cannot switch off when the model's ``generation_config`` sets them (a warning names them).
INHERITED_PROCESSORS = (
    "bad_words_ids",
    "sequence_bias",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "suppress_tokens",
    "begin_suppress_tokens",
    "exponential_decay_length_penalty",
    "watermarking_config",
    "top_h",
)


@dataclass
class ReflectionBatch:
    """Reflections for a batch of prompts."""

    texts: list[str]  # cleaned reflection text (no marker)
    num_tokens: list[int]  # generated tokens up to and including the stop (or the budget)
    stopped: list[bool]  # True when the marker/EOS ended the reflection within the budget
    prompt_ids: list[list[int]]  # the tokenised prompts (without padding), reusable by the caller
    seconds: float = 0.0
    # with ``record_tokens``: each reflection's generated token ids (up to its length) and their log-probs under the
    # model at the sampling temperature, from its raw logits (what a trained reflection player's PPO ratio divides by)
    token_ids: list[list[int]] | None = None
    token_logps: list[list[float]] | None = None


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

    ``freeze=False`` generates with a model that is being trained (the SFT trainer's reflection metrics): its
    mode, its ``requires_grad`` flags and the tokenizer's padding side are left alone (the caller switches to
    eval mode). ``synced_gpus=True`` (DeepSpeed ZeRO-3 / FSDP: every rank must run the same forwards) passes
    ``synced_gpus`` to ``generate`` and turns the shared-prefix and static-cache paths off, whose extra forward
    depends on each rank's own prompts.

    Reflections are drawn with this class's settings only (temperature, top-p, budget, stop): the logits processors
    a checkpoint's ``generation_config`` switches on are switched off (:data:`NEUTRAL_GENERATION`).
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
        freeze: bool = True,
        synced_gpus: bool = False,
        record_tokens: bool = False,
    ) -> None:
        if cache_implementation not in CACHE_IMPLEMENTATIONS:
            raise ValueError(
                f"ReflectionModel: cache_implementation={cache_implementation!r}; choose one of {CACHE_IMPLEMENTATIONS}"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.freeze = freeze
        if freeze:
            self.model.eval()
            for p in self.model.parameters():
                p.requires_grad_(False)
            self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.synced_gpus = synced_gpus
        if synced_gpus:
            shared_prefix_min_tokens, cache_implementation = 0, "dynamic"
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
        #: return the generated token ids and their sampling log-probs (a reflection player that is trained)
        self.record_tokens = record_tokens
        self._last_logps: torch.Tensor | None = None

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
                max_new_tokens=self.max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
                use_cache=True,
                # transformers compiles the forward (torch.compile, CUDA graphs) when generate gets a StaticCache on a
                # CUDA device; lock-step batches change their size and cache length every turn, so it would
                # recompile turn after turn (the static cache is here to avoid re-concatenation, not for compilation)
                disable_compile=True,
            )
            kwargs.update(NEUTRAL_GENERATION)
            if self.synced_gpus:
                kwargs["synced_gpus"] = True
            inherited = getattr(self.model, "generation_config", None)
            if self.temperature > 0:
                kwargs.update(do_sample=True, temperature=self.temperature, top_p=self.top_p, top_k=0)
                for name, value in NEUTRAL_WHEN_SET.items():
                    if getattr(inherited, name, None) is not None:
                        kwargs[name] = value
            else:
                kwargs.update(do_sample=False)
            kept = [name for name in INHERITED_PROCESSORS if getattr(inherited, name, None) is not None]
            if kept:
                logger.warning(
                    "ReflectionModel: the reflection model's generation_config sets %s, which generate applies on "
                    "top of the configured sampling%s; unset it in the model's generation_config.json",
                    ", ".join(kept),
                    " (a trained reflection player then learns slightly off-policy: its recorded log-probs are the "
                    "model's own)"
                    if self.record_tokens
                    else "",
                )
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
        if self.record_tokens:
            kwargs.update(output_logits=True, return_dict_in_generate=True)
        out = self.model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        if not self.record_tokens:
            return out[:, input_ids.shape[1] :]
        new = out.sequences[:, input_ids.shape[1] :]
        # log phi(y_j) at the sampling temperature from the model's raw logits (before any logits processor): the
        # expression of the training forward (ReflectionLearner.token_logps), so the first PPO epoch's ratio is 1
        temperature = self.temperature if self.temperature > 0 else 1.0
        self._last_logps = torch.stack(
            [
                (logits.float() / temperature).log_softmax(-1).gather(-1, new[:, j, None]).squeeze(-1)
                for j, logits in enumerate(out.logits)
            ],
            dim=1,
        )
        return new

    def generate(self, prompts: list[str], prompt_ids: list[list[int]] | None = None) -> ReflectionBatch:
        """Reflections for ``prompts`` (one batch, KV cache, per-sequence stop)."""
        # A model still being trained must not see inference tensors (lazily built buffers would keep them).
        with torch.inference_mode() if self.freeze else torch.no_grad():
            return self._generate(prompts, prompt_ids)

    def _generate(self, prompts: list[str], prompt_ids: list[list[int]] | None) -> ReflectionBatch:
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
        batch = ReflectionBatch(texts, lengths, stopped, ids, time.perf_counter() - start)
        if self.record_tokens:
            logps = self._last_logps.tolist()
            batch.token_ids = [row[:n] for row, n in zip(rows, lengths, strict=True)]
            batch.token_logps = [lp[:n] for lp, n in zip(logps, lengths, strict=True)]
        return batch
