"""A memo of greedy reflections: each distinct prompt is generated once.

A frozen reflection model decoding at temperature 0 writes the same reflection for the same prompt, so a rollout
need not generate it again. In RL the episodes of a group start in the same state and mostly agree for several
turns, and the same training tasks come back every few steps; in a greedy evaluation, configurations that share a
reflection model replay many of the same states (DangerousTaxi's ``dropoff`` stage has 12 start states). The
measured effect is in ``docs/performance.md``.

:class:`CachedReflectionPlayer` wraps any :class:`~reflect_trl.reflection.player.ReflectionPlayer` (in-process or
served): it looks every prompt up by a digest of its exact text, sends only the distinct misses to the wrapped player
(in their first-seen order) and returns the batch in the input order. It caches only a deterministic player
(``temperature == 0``); a sampling player is passed through untouched, because a memo would replace its draws.

What it can change: a batched ``generate`` equals one-prompt-at-a-time generation only up to float rounding (padding,
batch size), so a reflection served from the memo could differ in a near-tie from the one a fresh batch would have
produced. Results stay deterministic for a given seed; on the three seeds of ``make reproduce`` every evaluation
transcript and every logged RL value came out identical with and without the memo.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from typing import Any

from reflect_trl.reflection.model import ReflectionBatch

#: Entries kept by default. An entry is a 16-byte digest of the prompt, the reflection text and the prompt's token ids
#: (4 bytes each): about 1 kB for a DangerousTaxi prompt, so at most ~50 MB (RL checkpoints carry it); the demo's RL
#: runs fill a few thousand.
DEFAULT_REFLECTION_CACHE_SIZE = 50_000


def prompt_key(prompt: str) -> bytes:
    """The memo's key of a prompt: a 128-bit BLAKE2b digest of its exact text."""
    return hashlib.blake2b(prompt.encode("utf-8"), digest_size=16).digest()


class CachedReflectionPlayer:
    """``player`` with a least-recently-used memo of up to ``max_entries`` greedy reflections (0: no memo).

    ``hits`` and ``lookups`` count the prompts served from the memo and all prompts asked for since creation.
    """

    def __init__(self, player: Any, max_entries: int = DEFAULT_REFLECTION_CACHE_SIZE) -> None:
        if max_entries < 0:
            raise ValueError(f"reflection cache size must be >= 0, got {max_entries}")
        self.player = player
        self.max_entries = int(max_entries)
        self._memo: OrderedDict[bytes, tuple[str, int, bool, array]] = OrderedDict()
        self.hits = 0
        self.lookups = 0

    # The ReflectionPlayer attributes the rollout reads come from the wrapped player.
    @property
    def tokenizer(self) -> Any:
        return self.player.tokenizer

    @property
    def max_prompt_length(self) -> int | None:
        return self.player.max_prompt_length

    @property
    def enabled(self) -> bool:
        """True when the memo is used: a positive size and a deterministic (temperature 0) player."""
        return self.max_entries > 0 and float(getattr(self.player, "temperature", 1.0)) == 0.0

    def __len__(self) -> int:
        return len(self._memo)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    def state_dict(self) -> dict[str, Any]:
        """The memo's entries in recency order and its counters (a resumed RL run replays exactly the same hits)."""
        entries = [(key, text, n, stop, ids.tobytes()) for key, (text, n, stop, ids) in self._memo.items()]
        return {"entries": entries, "hits": self.hits, "lookups": self.lookups}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._memo = OrderedDict()
        for key, text, n, stop, raw in state["entries"]:
            ids = array("i")
            ids.frombytes(raw)
            self._memo[key] = (text, int(n), bool(stop), ids)
        while len(self._memo) > self.max_entries:
            self._memo.popitem(last=False)
        self.hits, self.lookups = int(state["hits"]), int(state["lookups"])

    def generate(self, prompts: list[str], prompt_ids: list[list[int]] | None = None) -> ReflectionBatch:
        """Reflections for ``prompts``, generating only the distinct prompts the memo does not hold."""
        if not self.enabled:
            return self.player.generate(prompts, prompt_ids)
        if prompt_ids is not None and len(prompt_ids) != len(prompts):
            raise ValueError(f"{len(prompt_ids)} prompt_ids for {len(prompts)} prompts")
        self.lookups += len(prompts)
        keys = [prompt_key(p) for p in prompts]
        missing: dict[bytes, int] = {}  # key -> its first position in `prompts`
        for i, key in enumerate(keys):
            if key in self._memo:
                self._memo.move_to_end(key)
            elif key not in missing:
                missing[key] = i
        self.hits += len(prompts) - len(missing)
        seconds = 0.0
        fresh: dict[bytes, tuple[str, int, bool, array]] = {}
        if missing:
            order = list(missing.values())
            ids = [list(prompt_ids[i]) for i in order] if prompt_ids is not None else None
            batch = self.player.generate([prompts[i] for i in order], ids)
            seconds = batch.seconds
            for k, key in enumerate(missing):
                row_ids = array("i", batch.prompt_ids[k] if k < len(batch.prompt_ids) else [])
                fresh[key] = (batch.texts[k], int(batch.num_tokens[k]), bool(batch.stopped[k]), row_ids)
        rows = [fresh.get(k) or self._memo[k] for k in keys]
        for key, entry in fresh.items():
            self._memo[key] = entry
        while len(self._memo) > self.max_entries:
            self._memo.popitem(last=False)
        return ReflectionBatch(
            texts=[r[0] for r in rows],
            num_tokens=[r[1] for r in rows],
            stopped=[r[2] for r in rows],
            prompt_ids=[r[3].tolist() for r in rows],
            seconds=seconds,
        )


def with_reflection_cache(player: Any, max_entries: int = DEFAULT_REFLECTION_CACHE_SIZE) -> Any:
    """``player`` wrapped in a :class:`CachedReflectionPlayer` when that memo would be used, else ``player``."""
    if player is None:
        return None
    cached = CachedReflectionPlayer(player, max_entries)
    return cached if cached.enabled else player
