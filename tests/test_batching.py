"""Batching helpers: left padding, positions that skip it, the shared-prefix layout and its KV cache."""

from __future__ import annotations

import torch

from reflect_trl.batching import (
    left_pad,
    position_ids_from_mask,
    prefix_kv_cache,
    prefix_layout,
    shared_prefix_length,
)


def test_left_pad_and_position_ids():
    ids, mask = left_pad([[5, 6, 7], [8], []], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert position_ids_from_mask(mask).tolist() == [[0, 1, 2], [0, 0, 0], [0, 0, 0]]
    assert position_ids_from_mask(torch.tensor([[0, 1, 1, 1]])).tolist() == [[0, 0, 1, 2]]


def test_shared_prefix_length_and_layout():
    rows = [[1, 2, 3, 4, 9], [1, 2, 3, 7], [1, 2, 3, 4, 5, 6]]
    assert shared_prefix_length(rows, min_tokens=3) == 3
    assert shared_prefix_length(rows, min_tokens=4) == 0, "shorter than min_tokens"
    assert shared_prefix_length(rows[:1], min_tokens=1) == 0, "one sequence has nothing to share"
    assert shared_prefix_length([[1, 2], [1, 2, 3]], min_tokens=1) == 1, "every row keeps a token after it"
    ids, mask = prefix_layout(rows, 3, pad_id=0)
    assert ids.tolist() == [[1, 2, 3, 0, 4, 9], [1, 2, 3, 0, 0, 7], [1, 2, 3, 4, 5, 6]]
    assert mask.tolist() == [[1, 1, 1, 0, 1, 1], [1, 1, 1, 0, 0, 1], [1, 1, 1, 1, 1, 1]]
    # Positions skip the padding: every row sees the positions of its unpadded prompt.
    assert position_ids_from_mask(mask)[1].tolist()[-1] == 3
    assert prefix_layout(rows, 0, pad_id=0)[0].tolist() == left_pad(rows, 0)[0].tolist()


def test_prefix_kv_cache_gives_the_logits_of_the_whole_prompts(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    rows = [[5, 6, 7, 8, 9, 10], [5, 6, 7, 8, 11], [5, 6, 7, 8, 12, 13, 14]]
    prefix = shared_prefix_length(rows, min_tokens=2)
    assert prefix == 4
    ids, mask = prefix_layout(rows, prefix, pad_id=0)
    positions = position_ids_from_mask(mask)
    with torch.no_grad():
        for static_length in (None, ids.shape[1]):
            cache = prefix_kv_cache(model, rows[0][:prefix], len(rows), static_length)
            out = model(
                input_ids=ids[:, prefix:],
                attention_mask=mask,
                position_ids=positions[:, prefix:],
                cache=cache,
                use_cache=True,
            )
            for b, row in enumerate(rows):
                alone = model(input_ids=torch.tensor([row])).logits[0, -1]
                torch.testing.assert_close(out.logits[b, -1], alone, atol=1e-4, rtol=1e-4)
