"""A memo of the frozen reference policy's option tables, keyed by (prompt tokens, offered options).

The KL term of the RL loss needs ``log pi_ref(. | s_t)`` over the offered options for every turn of every rollout.
The reference never changes (unless ``sync_ref_model``), and in a small environment the same (state, reflection)
prompt comes back again and again, so a turn seen before is answered from the memo instead of a forward of the
reference model. A value is the one the reference gave when the turn was first scored (another micro-batch: equal up
to float rounding). The memo is a bounded LRU of float32 tables; it is saved with the checkpoints so a resumed run
reads the same values.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

#: Entries kept by default (a 16-byte key and 4 bytes per offered option each).
DEFAULT_REF_LOGPS_MEMO_SIZE = 200_000


def turn_key(prompt_ids: Sequence[int], num_options: int) -> bytes:
    """A 16-byte digest of one turn prompt: its unpadded tokens and the number of options offered."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(b"%d;" % num_options)
    digest.update(",".join(map(str, prompt_ids)).encode())
    return digest.digest()


class RefLogpsMemo:
    """Bounded LRU of reference option tables (the offered options' log-probs) by :func:`turn_key`, with hit counts."""

    def __init__(self, max_size: int = DEFAULT_REF_LOGPS_MEMO_SIZE) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        self.max_size = max_size
        self._values: OrderedDict[bytes, bytes] = OrderedDict()
        self.hits = 0
        self.lookups = 0

    def __len__(self) -> int:
        return len(self._values)

    def get(self, key: bytes) -> torch.Tensor | None:
        """The offered options' log-probs of a turn seen before (float32), else None."""
        self.lookups += 1
        value = self._values.get(key)
        if value is None:
            return None
        self.hits += 1
        self._values.move_to_end(key)
        return torch.frombuffer(bytearray(value), dtype=torch.float32)

    def put(self, key: bytes, offered_log_probs: torch.Tensor) -> None:
        self._values[key] = offered_log_probs.detach().float().cpu().numpy().tobytes()
        self._values.move_to_end(key)
        while len(self._values) > self.max_size:
            self._values.popitem(last=False)

    def state_dict(self) -> dict[str, Any]:
        return {"values": list(self._values.items()), "hits": self.hits, "lookups": self.lookups}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._values = OrderedDict(state["values"])
        self.hits, self.lookups = int(state["hits"]), int(state["lookups"])


__all__ = ["DEFAULT_REF_LOGPS_MEMO_SIZE", "RefLogpsMemo", "turn_key"]
