"""Option-restricted action head: label-logit gather, masking, padding invariance, PEFT, sampling, entropy."""

from __future__ import annotations

import math

import pytest
import torch

from reflect_trl.action_head import OptionHead, masked_log_probs, options_mask
from reflect_trl.batching import unpad_left
from reflect_trl.prompts import build_prompt
from reflect_trl.rl_math import entropy_from_log_probs

PROMPTS = [
    build_prompt("Taxi at row 2, col 2.", ("move south", "move north", "move east")).text,
    build_prompt(
        "Taxi at row 0, col 4. Passenger waiting at row 4, col 3.", ("move west", "pickup passenger")
    ).text,
    build_prompt(
        "s", ("move south", "move north", "move east", "move west", "pickup passenger"), "go east"
    ).text,
]
NUM_OPTIONS = [3, 2, 5]


def _load(model_dir: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    return model, tok


@pytest.fixture(scope="module")
def gpt2(tiny_model_dir):
    return _load(tiny_model_dir)


@pytest.fixture(scope="module")
def llama(tiny_llama_dir):
    return _load(tiny_llama_dir)


def _batch(tok, texts):
    enc = tok(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def _log_probs(head, model, ids, mask, num_options, **kwargs):
    """The option table of a left-padded batch through the one scoring function."""
    return head.forward(model, unpad_left(ids, mask), num_options.tolist(), **kwargs).log_probs


def test_options_mask_and_masked_log_probs():
    mask = options_mask(torch.tensor([1, 3]), 4)
    assert mask.tolist() == [[True, False, False, False], [True, True, True, False]]
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 9.0]])
    lp = masked_log_probs(logits, torch.tensor([1, 3]), temperature=2.0)
    assert lp[0].tolist() == [0.0, -math.inf, -math.inf, -math.inf]
    expected = torch.log_softmax(logits[1, :3] / 2.0, -1)
    torch.testing.assert_close(lp[1, :3], expected)
    assert lp[1, 3].item() == -math.inf


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_probabilities_are_softmax_of_gathered_label_logits(which, request):
    model, tok = request.getfixturevalue(which)
    head = OptionHead(tok)
    for text, n in zip(PROMPTS, NUM_OPTIONS, strict=True):
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        mask = torch.ones_like(ids)
        with torch.no_grad():
            manual = model(ids).logits[:, -1, head.label_ids]  # full-vocab forward
            log_probs = _log_probs(head, model, ids, mask, torch.tensor([n]))
        probs = log_probs.exp()[0]
        torch.testing.assert_close(probs[:n], torch.softmax(manual[0, :n], -1), atol=1e-6, rtol=1e-5)
        assert torch.all(probs[n:] == 0.0), "options not offered must get probability exactly 0"
        assert probs.sum().item() == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_left_padded_batch_equals_unbatched(which, request):
    model, tok = request.getfixturevalue(which)
    head = OptionHead(tok)
    ids, mask = _batch(tok, PROMPTS)
    assert (mask[:, 0] == 0).any(), "the batch must actually contain left padding"
    with torch.no_grad():
        batched = _log_probs(head, model, ids, mask, torch.tensor(NUM_OPTIONS))
        for i, (text, n) in enumerate(zip(PROMPTS, NUM_OPTIONS, strict=True)):
            one_ids, one_mask = _batch(tok, [text])
            single = _log_probs(head, model, one_ids, one_mask, torch.tensor([n]))
            torch.testing.assert_close(batched[i, :n], single[0, :n], atol=1e-5, rtol=0)
            assert torch.all(batched[i, n:] == -math.inf)


def test_same_results_with_zero_lora_adapter(gpt2):
    from peft import LoraConfig, get_peft_model

    model, tok = gpt2
    head = OptionHead(tok)
    ids, mask = _batch(tok, PROMPTS)
    n = torch.tensor(NUM_OPTIONS)
    with torch.no_grad():
        reference = _log_probs(head, model, ids, mask, n)
    import copy

    base = copy.deepcopy(model)
    peft_model = get_peft_model(
        base,
        LoraConfig(
            r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True, init_lora_weights=False
        ),
    )
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.zero_()
    lora_b = [p for name, p in peft_model.named_parameters() if "lora_B" in name]
    assert lora_b and all(torch.all(p == 0) for p in lora_b)
    peft_model.eval()
    with torch.no_grad():
        wrapped = _log_probs(head, peft_model, ids, mask, n)
    torch.testing.assert_close(wrapped, reference, atol=1e-6, rtol=0)


def test_select_greedy_and_sampling_respects_mask():
    log_probs = masked_log_probs(
        torch.tensor([[0.1, 2.0, 0.3, 9.0], [1.0, 1.0, -1.0, 0.0]]), torch.tensor([3, 2])
    )
    assert OptionHead.select(log_probs, greedy=True).tolist() == [1, 0]  # row 1: first of the tied maxima
    assert torch.equal(OptionHead.select(log_probs, greedy=True), log_probs.argmax(-1))
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([OptionHead.select(log_probs, generator=gen) for _ in range(4000)])
    assert draws[:, 0].max().item() <= 2 and draws[:, 1].max().item() <= 1, "never a masked option"
    freq = torch.bincount(draws[:, 0], minlength=4).float() / draws.shape[0]
    torch.testing.assert_close(freq, log_probs[0].exp(), atol=0.03, rtol=0)
    assert set(draws[:, 1].tolist()) == {0, 1}
    again = torch.Generator().manual_seed(0)
    assert torch.equal(OptionHead.select(log_probs, generator=again), draws[0]), (
        "seeded sampling is reproducible"
    )


def test_entropy_from_masked_log_probs():
    lp = masked_log_probs(torch.tensor([[0.0, 0.0, 5.0, 5.0], [3.0, 1.0, 2.0, 0.0]]), torch.tensor([2, 1]))
    entropy = entropy_from_log_probs(lp)
    assert torch.isfinite(entropy).all()
    assert entropy[0].item() == pytest.approx(math.log(2), abs=1e-6)
    assert entropy[1].item() == 0.0
    p = torch.tensor([0.7, 0.2, 0.1])
    three = masked_log_probs(p.log()[None], torch.tensor([3]))
    assert entropy_from_log_probs(three).item() == pytest.approx(float(-(p * p.log()).sum()), abs=1e-6)


def test_option_head_rejects_a_tokenizer_without_the_labels(tmp_path):
    from transformers import AutoTokenizer

    from reflect_trl.tiny_models import build_tokenizer

    build_tokenizer(["hello world"], vocab_size=400).save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"\['AB'\]"):
        OptionHead(tok, labels=("A", "AB"))
    assert OptionHead(tok, labels=("A", "B")).num_labels == 2
