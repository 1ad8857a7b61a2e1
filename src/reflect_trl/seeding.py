"""Stable seeds derived from named parts (episode seeds, option shuffles, data-builder streams, RNG streams)."""

from __future__ import annotations

import hashlib
from typing import Any

#: Every derived seed lies in ``[0, SEED_BOUND)``.
SEED_BOUND = 2**31


def derive_seed(*parts: Any) -> int:
    """A stable 31-bit seed from printable parts: ``sha256("/".join(map(str, parts)))``, first 4 bytes, top bit
    cleared.

    Stable across runs, processes and platforms (a hash, not Python's salted ``hash``), so the same parts give the
    same seed in every run and on every rank. 31 bits because the value must be accepted everywhere a seed goes:
    ``random.Random`` (any int), numpy's ``np_random(seed)`` / ``default_rng`` (any non-negative int) and the
    legacy ``RandomState`` (< 2**32), ``torch.manual_seed`` (< 2**64), and libraries that keep a seed in a signed
    32-bit integer (some game generators); 2**31 values keep collisions between the few thousand seeds of a run
    negligible. ``reflect_trl.envs.base.split_seed`` hashes the same way (its parts are base seed, split, index).
    """
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & (SEED_BOUND - 1)


__all__ = ["SEED_BOUND", "derive_seed"]
