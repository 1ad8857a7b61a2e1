"""Replay buffer: FIFO capacity, seeded sampling, checkpoint round trip restores future samples."""

from __future__ import annotations

import json

from reflect_trl.trainers.replay import ReplayBuffer, ReplayTurn


def _turns(n: int, start: int = 0) -> list[ReplayTurn]:
    return [
        ReplayTurn(prompt_ids=(i, i + 1, i + 2), option=i % 6, num_options=6, return_to_go=i / 10)
        for i in range(start, start + n)
    ]


def test_fifo_capacity():
    buf = ReplayBuffer(capacity=5, seed=0)
    assert len(buf) == 0 and buf.sample(3) == []
    buf.add(_turns(3))
    buf.add(_turns(4, start=3))
    assert len(buf) == 5
    assert [t.prompt_ids[0] for t in buf.turns] == [2, 3, 4, 5, 6], "oldest turns are evicted first"
    assert buf.sample(0) == []
    buf.clear()
    assert len(buf) == 0


def test_seeded_sampling_is_reproducible():
    a, b, c = ReplayBuffer(100, seed=7), ReplayBuffer(100, seed=7), ReplayBuffer(100, seed=8)
    for buf in (a, b, c):
        buf.add(_turns(50))
    draws_a = [a.sample(4) for _ in range(5)]
    draws_b = [b.sample(4) for _ in range(5)]
    assert draws_a == draws_b
    assert draws_a != [c.sample(4) for _ in range(5)]
    assert all(t in a.turns for draw in draws_a for t in draw)
    assert len(a.sample(80)) == 80, "sampling is with replacement"


def test_state_dict_round_trip_restores_future_samples():
    buf = ReplayBuffer(capacity=10, seed=3)
    buf.add(_turns(12))
    buf.sample(5)  # advance the rng
    state = buf.state_dict()
    restored = ReplayBuffer(capacity=10, seed=999)
    restored.load_state_dict(state)
    assert list(restored.turns) == list(buf.turns)
    assert restored.sample(8) == buf.sample(8)
    # Also through JSON (tuples become lists in a checkpoint file).
    state = json.loads(json.dumps(buf.state_dict()))
    from_json = ReplayBuffer(capacity=10, seed=0)
    from_json.load_state_dict(state)
    assert list(from_json.turns) == list(buf.turns)
    assert all(isinstance(t.prompt_ids, tuple) for t in from_json.turns)
    assert [from_json.sample(3) for _ in range(4)] == [buf.sample(3) for _ in range(4)]
    from_json.add(_turns(1, start=50))
    assert len(from_json) == 10, "the restored buffer keeps its capacity"
