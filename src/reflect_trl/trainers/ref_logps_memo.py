"""A memo of the frozen reference policy's log-probs, keyed by (prompt tokens, chosen option, offered options).

The KL term of the RL loss needs ``log pi_ref(a_t | s_t)`` for every turn of every rollout. The reference never
changes (unless ``sync_ref_model``), and in a small environment the same (state, reflection) prompt and option come
back again and again, so a turn seen before is answered from the memo instead of a forward of the reference model.
A value is the one the reference gave when the turn was first scored (another micro-batch: equal up to float
rounding). The memo is a bounded LRU; it is saved with the checkpoints so a resumed run reads the same values.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

#: Entries kept by default (about 150 bytes each).
DEFAULT_REF_LOGPS_MEMO_SIZE = 200_000


def turn_key(prompt_ids: Sequence[int], option: int, num_options: int) -> bytes:
    """A 16-byte digest of one turn: its unpadded prompt tokens, the option taken and the number offered."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(b"%d,%d;" % (option, num_options))
    digest.update(",".join(map(str, prompt_ids)).encode())
    return digest.digest()


class RefLogpsMemo:
    """Bounded LRU of reference log-probs by :func:`turn_key`, with hit counts."""

    def __init__(self, max_size: int = DEFAULT_REF_LOGPS_MEMO_SIZE) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        self.max_size = max_size
        self._values: OrderedDict[bytes, float] = OrderedDict()
        self.hits = 0
        self.lookups = 0

    def __len__(self) -> int:
        return len(self._values)

    def get(self, key: bytes) -> float | None:
        self.lookups += 1
        value = self._values.get(key)
        if value is not None:
            self.hits += 1
            self._values.move_to_end(key)
        return value

    def put(self, key: bytes, value: float) -> None:
        self._values[key] = value
        self._values.move_to_end(key)
        while len(self._values) > self.max_size:
            self._values.popitem(last=False)

    def state_dict(self) -> dict[str, Any]:
        return {"values": list(self._values.items()), "hits": self.hits, "lookups": self.lookups}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._values = OrderedDict(state["values"])
        self.hits, self.lookups = int(state["hits"]), int(state["lookups"])


__all__ = ["DEFAULT_REF_LOGPS_MEMO_SIZE", "RefLogpsMemo", "turn_key"]
