"""The reference tables memo: keys, LRU bound, counts, state round trip."""

from __future__ import annotations

import pytest
import torch

from reflect_trl.trainers.ref_logps_memo import RefLogpsMemo, turn_key


def test_keys_tell_prompts_and_offers_apart():
    base = turn_key([1, 2, 3], 6)
    assert base == turn_key([1, 2, 3], 6) and len(base) == 16
    assert len({base, turn_key([1, 2, 4], 6), turn_key([1, 2, 3], 5)}) == 3
    assert turn_key([12, 3], 6) != turn_key([1, 23], 6)


def test_lru_bound_counts_and_state_round_trip():
    memo = RefLogpsMemo(max_size=2)
    a, b, c = (turn_key([i], 2) for i in range(3))
    tables = {k: torch.tensor([-0.25 * (i + 1), -1.5 - i]) for i, k in enumerate((a, b, c))}
    memo.put(a, tables[a])
    memo.put(b, tables[b])
    assert torch.equal(memo.get(a), tables[a])  # a is now the most recent
    memo.put(c, tables[c])  # evicts b
    assert memo.get(b) is None and torch.equal(memo.get(c), tables[c]) and len(memo) == 2
    assert (memo.hits, memo.lookups) == (2, 3)
    copy = RefLogpsMemo(max_size=2)
    copy.load_state_dict(memo.state_dict())
    assert torch.equal(copy.get(a), tables[a]) and (copy.hits, copy.lookups) == (3, 4)
    with pytest.raises(ValueError, match="max_size must be >= 1"):
        RefLogpsMemo(0)
