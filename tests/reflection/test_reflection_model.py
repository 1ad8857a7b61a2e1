"""The frozen reflection model: batched generate, budget, per-sequence stop at the marker, cutting, freezing."""

from __future__ import annotations

import pytest
import torch

from reflect_trl.prompts import STOP_MARKER, reflection_prompt
from reflect_trl.reflection.model import ReflectionModel, stop_token_ids

PROMPTS = [
    reflection_prompt("Taxi at row 2, col 2. Passenger waiting at row 0, col 4."),
    reflection_prompt("Taxi at row 4, col 3."),
    reflection_prompt("Goal: drive to the passenger and pick them up.\nTaxi at row 1, col 0."),
]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


class FakeGenerator(torch.nn.Module):
    """Stands in for a causal LM: ``generate`` appends fixed rows of new tokens and records its kwargs."""

    def __init__(self, new_rows: list[list[int]]) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.new_rows = torch.tensor(new_rows, dtype=torch.long)
        self.kwargs: dict = {}

    def generate(self, input_ids, attention_mask, **kwargs):
        self.kwargs = kwargs
        assert input_ids.shape == attention_mask.shape and input_ids.shape[0] == self.new_rows.shape[0]
        return torch.cat([input_ids, self.new_rows], dim=1)


def _pad_to(ids: list[int], width: int, pad: int) -> list[int]:
    return ids + [pad] * (width - len(ids))


def test_stop_token_ids(tiny):
    _, tok = tiny
    marker = tok.convert_tokens_to_ids(STOP_MARKER)
    assert stop_token_ids(tok) == [marker, tok.eos_token_id]


def test_generation_is_cut_at_the_marker(tiny):
    _, tok = tiny
    marker, eos, pad = tok.convert_tokens_to_ids(STOP_MARKER), tok.eos_token_id, tok.pad_token_id
    budget = 10
    go_east, north = _ids(tok, "go east"), _ids(tok, "move north")
    long_text = _ids(tok, "move south then move west then pickup passenger and more")[:budget]
    assert len(long_text) == budget and marker not in long_text and eos not in long_text
    rows = [
        _pad_to(go_east + [marker], budget, pad),  # stopped by the marker
        long_text,  # ran out of budget
        _pad_to(north + [eos], budget, pad),  # stopped by EOS
        _pad_to(
            _ids(tok, "a") + [marker] + _ids(tok, "junk # Options:"), budget, pad
        ),  # text after the marker
    ]
    fake = FakeGenerator(rows)
    model = ReflectionModel(fake, tok, max_new_tokens=budget, temperature=0.7, top_p=0.9)
    batch = model.generate(PROMPTS + PROMPTS[:1])
    assert batch.texts == ["go east", tok.decode(long_text), "move north", "a"]
    assert batch.num_tokens == [len(go_east) + 1, budget, len(north) + 1, len(_ids(tok, "a")) + 1]
    assert batch.stopped == [True, False, True, True]
    assert fake.kwargs["eos_token_id"] == [marker, eos]
    assert fake.kwargs["max_new_tokens"] == budget and fake.kwargs["do_sample"] is True
    assert fake.kwargs["temperature"] == 0.7 and fake.kwargs["top_p"] == 0.9
    assert batch.prompt_ids == [_ids(tok, p) for p in PROMPTS + PROMPTS[:1]]

    greedy = ReflectionModel(FakeGenerator(rows), tok, max_new_tokens=budget, temperature=0.0)
    greedy.generate(PROMPTS + PROMPTS[:1])
    assert greedy.model.kwargs["do_sample"] is False


def test_multi_token_marker_uses_stop_strings():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<eos>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    raw.train_from_iterator(["go east now", "move north"], trainer=trainer)
    from tokenizers import decoders

    raw.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    assert stop_token_ids(tok) is None, "the marker is several tokens here"
    pad = tok.pad_token_id
    stopped_row = _ids(tok, "go east" + STOP_MARKER)
    plain_row = _ids(tok, "move north")
    width = max(len(stopped_row), len(plain_row)) + 2
    fake = FakeGenerator([_pad_to(stopped_row, width, pad), _pad_to(plain_row, width, pad)])
    batch = ReflectionModel(fake, tok, max_new_tokens=width).generate(["a\n", "b\n"])
    assert fake.kwargs["stop_strings"] == [STOP_MARKER] and fake.kwargs["tokenizer"] is tok
    assert fake.kwargs["eos_token_id"] == tok.eos_token_id
    assert batch.texts == ["go east", "move north"]
    assert batch.num_tokens == [len(stopped_row), len(plain_row)], "trailing padding is not counted"
    assert batch.stopped == [True, False]


def test_model_is_frozen_and_in_eval_mode(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).train()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.padding_side = "right"
    reflection = ReflectionModel(model, tok)
    assert not reflection.model.training
    assert not any(p.requires_grad for p in reflection.model.parameters())
    assert tok.padding_side == "left"
    assert reflection.generate([]).texts == []


def test_a_model_in_training_is_left_as_it_is(tiny_model_dir):
    """freeze=False (SFT's reflection metrics): mode, gradients and padding side untouched; no inference tensors."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).train()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.padding_side = "right"
    seen = {}

    def spy(module, args, kwargs, output):
        seen["inference_mode"] = torch.is_inference_mode_enabled()
        seen["grad"] = torch.is_grad_enabled()

    model.register_forward_hook(spy, with_kwargs=True)
    reflection = ReflectionModel(model, tok, max_new_tokens=3, temperature=0.0, freeze=False)
    assert model.training and all(p.requires_grad for p in model.parameters()) and tok.padding_side == "right"
    batch = reflection.generate(PROMPTS[:2])
    assert len(batch.texts) == 2 and seen == {"inference_mode": False, "grad": False}
    ReflectionModel(model, tok, max_new_tokens=3).generate(PROMPTS[:1])  # frozen: inference mode
    assert seen["inference_mode"] is True


def test_generate_is_never_compiled(tiny):
    """On CUDA, transformers compiles the forward of a generate given a StaticCache; lock-step batches change shape
    every turn, so the reflection player keeps it eager (tests/cuda checks it on a device)."""
    _, tok = tiny
    fake = FakeGenerator([_ids(tok, "go east") + [tok.convert_tokens_to_ids(STOP_MARKER)]])
    ReflectionModel(fake, tok, max_new_tokens=8).generate(PROMPTS[:1])
    assert fake.kwargs["disable_compile"] is True


def test_synced_gpus_takes_the_plain_generate_path(tiny):
    _, tok = tiny
    fake = FakeGenerator([_ids(tok, "go east") + [tok.convert_tokens_to_ids(STOP_MARKER)]] * 3)
    reflection = ReflectionModel(fake, tok, max_new_tokens=8, synced_gpus=True)
    assert reflection.shared_prefix_min_tokens == 0 and reflection.cache_implementation == "dynamic"
    assert reflection.generate(PROMPTS).texts == ["go east"] * 3
    assert fake.kwargs["synced_gpus"] is True and "cache" not in fake.kwargs


def test_real_generate_respects_budget_and_is_seeded(tiny):
    model, tok = tiny
    reflection = ReflectionModel(model, tok, max_new_tokens=6, temperature=1.0)
    torch.manual_seed(1)
    first = reflection.generate(PROMPTS)
    torch.manual_seed(1)
    second = reflection.generate(PROMPTS)
    assert first.texts == second.texts and first.num_tokens == second.num_tokens
    assert len(first.texts) == len(PROMPTS) == len(first.num_tokens) == len(first.stopped)
    for n, stopped, text in zip(first.num_tokens, first.stopped, first.texts, strict=True):
        assert 1 <= n <= 6
        assert stopped or n == 6, "an unstopped reflection used the whole budget"
        assert STOP_MARKER not in text
    assert first.prompt_ids == [_ids(tok, p) for p in PROMPTS]
    assert first.seconds > 0
    short = ReflectionModel(model, tok, max_new_tokens=2, temperature=0.0, max_prompt_length=5)
    batch = short.generate(PROMPTS)
    assert batch.prompt_ids == [_ids(tok, p)[-5:] for p in PROMPTS]
    assert all(n <= 2 for n in batch.num_tokens)


def test_real_generate_stops_per_sequence_at_the_marker(tiny):
    """Steer the real model (a logits hook) so row 0 writes the marker as its 3rd token and row 1 never stops."""
    model, tok = tiny
    reflection = ReflectionModel(model, tok, max_new_tokens=7, temperature=1.0)
    marker = tok.convert_tokens_to_ids(STOP_MARKER)
    stops = stop_token_ids(tok)
    calls = {"n": 0}

    def steer(_module, _inputs, logits):
        logits = logits.clone()
        logits[..., stops] = float("-inf")
        if calls["n"] == 2:  # the 3rd generated token
            logits[0, -1, marker] = 1e4
        calls["n"] += 1
        return logits

    handle = model.get_output_embeddings().register_forward_hook(steer)
    try:
        torch.manual_seed(0)
        batch = reflection.generate(PROMPTS[:2])
    finally:
        handle.remove()
    assert batch.num_tokens == [3, 7]
    assert batch.stopped == [True, False]
    assert all(STOP_MARKER not in t for t in batch.texts)
