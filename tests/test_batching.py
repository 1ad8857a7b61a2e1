"""Batching helpers: left padding, positions that skip it, the shared-prefix layout and its KV caches."""

from __future__ import annotations

import torch

from reflect_trl.batching import (
    context_kv_cache,
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


def test_context_kv_cache_lets_a_next_forward_continue_every_row(tiny_model_dir):
    """A forward over each row's continuation, given the context cache and the mask extended by its own columns,
    gives the logits of the whole rows — with a shared prefix and without one (rows of different lengths)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    contexts = [[5, 6, 7, 8, 9, 10], [5, 6, 7, 8, 11], [5, 6, 7, 8, 12, 13, 14]]
    tails = [[20, 21], [22, 23], [24, 25]]
    with torch.no_grad():
        for prefix in (4, 0):
            cache, mask = context_kv_cache(model, contexts, prefix, pad_id=0)
            assert mask.shape == (3, 7) and mask.sum(-1).tolist() == [6, 5, 7]
            positions = torch.tensor([[len(c), len(c) + 1] for c in contexts])
            out = model(
                input_ids=torch.tensor(tails),
                attention_mask=torch.cat([mask, torch.ones(3, 2, dtype=mask.dtype)], dim=1),
                position_ids=positions,
                cache=cache,
            )
            for b, (context, tail) in enumerate(zip(contexts, tails, strict=True)):
                alone = model(input_ids=torch.tensor([context + tail])).logits[0, -2:]
                torch.testing.assert_close(out.logits[b], alone, atol=1e-4, rtol=1e-4)
