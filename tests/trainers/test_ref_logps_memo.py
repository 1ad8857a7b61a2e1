"""The reference log-probs memo: keys, LRU bound, counts, state round trip."""

from __future__ import annotations

import pytest

from reflect_trl.trainers.ref_logps_memo import RefLogpsMemo, turn_key


def test_keys_tell_prompts_options_and_offers_apart():
    base = turn_key([1, 2, 3], 0, 6)
    assert base == turn_key([1, 2, 3], 0, 6) and len(base) == 16
    assert len({base, turn_key([1, 2, 4], 0, 6), turn_key([1, 2, 3], 1, 6), turn_key([1, 2, 3], 0, 5)}) == 4
    assert turn_key([12, 3], 0, 6) != turn_key([1, 23], 0, 6)


def test_lru_bound_counts_and_state_round_trip():
    memo = RefLogpsMemo(max_size=2)
    a, b, c = (turn_key([i], 0, 2) for i in range(3))
    memo.put(a, -0.5)
    memo.put(b, -1.0)
    assert memo.get(a) == -0.5  # a is now the most recent
    memo.put(c, -2.0)  # evicts b
    assert memo.get(b) is None and memo.get(c) == -2.0 and len(memo) == 2
    assert (memo.hits, memo.lookups) == (2, 3)
    copy = RefLogpsMemo(max_size=2)
    copy.load_state_dict(memo.state_dict())
    assert copy.get(a) == -0.5 and (copy.hits, copy.lookups) == (3, 4)
    with pytest.raises(ValueError, match="max_size must be >= 1"):
        RefLogpsMemo(0)
