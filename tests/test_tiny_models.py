"""Tiny offline models: save/reload/generate, determinism, single-token labels and marker, argument errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from reflect_trl.prompts import DEFAULT_LABELS, STOP_MARKER, build_prompt, label_token_ids
from reflect_trl.tiny_models import (
    PRESETS,
    build_model_config,
    build_tiny_model,
    build_tokenizer,
    default_corpus,
)

SMALL_CORPUS = [
    build_prompt(
        "Taxi at row 1, col 2. Passenger waiting at row 0, col 0.", ("move north", "move west"), "go west"
    ).text,
    build_prompt("Taxi at row 4, col 3.", ("move south", "drop off passenger")).text,
]


@pytest.mark.parametrize("fixture", ["tiny_model_dir", "tiny_llama_dir"])
def test_reload_and_generate(fixture, request):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = request.getfixturevalue(fixture)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    expected_type = "gpt2" if fixture == "tiny_model_dir" else "llama"
    assert model.config.model_type == expected_type
    assert model.config.vocab_size == len(tok)
    assert model.config.pad_token_id == tok.pad_token_id
    meta = json.loads((Path(model_dir) / "reflect_trl_tiny.json").read_text())
    assert (
        meta["arch"] == expected_type
        and meta["preset"] == "nano"
        and meta["params"] == model.num_parameters()
    )
    enc = tok(
        ["Taxi at row 2, col 2.\n# Reflection:\n", "Goal:"],
        add_special_tokens=False,
        padding=True,
        return_tensors="pt",
    )
    torch.manual_seed(0)
    out = model.generate(**enc, max_new_tokens=5, do_sample=True, pad_token_id=tok.pad_token_id)
    assert out.shape[0] == 2 and enc["input_ids"].shape[1] < out.shape[1] <= enc["input_ids"].shape[1] + 5
    assert isinstance(tok.decode(out[0]), str)


@pytest.mark.parametrize("fixture", ["tiny_model_dir", "tiny_llama_dir"])
def test_labels_and_stop_marker_are_single_tokens(fixture, request):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(request.getfixturevalue(fixture))
    ids = label_token_ids(tok, DEFAULT_LABELS)  # raises if any label is not one distinct token
    assert len(set(ids)) == len(DEFAULT_LABELS)
    marker = tok(STOP_MARKER, add_special_tokens=False)["input_ids"]
    assert len(marker) == 1
    in_context = tok("move east twice" + STOP_MARKER + "\n", add_special_tokens=False)["input_ids"]
    assert marker[0] in in_context, "the marker stays one token inside text"
    assert tok.decode(marker) == STOP_MARKER


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_build_is_deterministic_for_a_seed(arch, tmp_path):
    from transformers import AutoModelForCausalLM

    dirs = [
        build_tiny_model(tmp_path / name, arch=arch, preset="nano", seed=seed, texts=SMALL_CORPUS)
        for name, seed in (("a", 3), ("b", 3), ("c", 4))
    ]
    assert (dirs[0] / "tokenizer.json").read_bytes() == (dirs[1] / "tokenizer.json").read_bytes()
    a, b, c = (AutoModelForCausalLM.from_pretrained(d).state_dict() for d in dirs)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a), "another seed gives other weights"


def test_tokenizer_training_is_deterministic_and_left_padded():
    first, second = (
        build_tokenizer(SMALL_CORPUS, vocab_size=512),
        build_tokenizer(SMALL_CORPUS, vocab_size=512),
    )
    assert first.get_vocab() == second.get_vocab()
    assert first.padding_side == "left" and first.pad_token == "<pad>" and first.eos_token == "<eos>"
    assert len(first) <= 512


def test_default_corpus_renders_prompts_deterministically():
    corpus = default_corpus(("taxi",), n_tasks=3, seed=1)
    assert corpus == default_corpus(("taxi",), n_tasks=3, seed=1)
    assert corpus and all("# Options:\n" in line and line.endswith("# Action:\n") for line in corpus)
    assert any(STOP_MARKER in line for line in corpus), "oracle reflections end with the stop marker"


def test_unknown_arch_or_preset_errors(tmp_path):
    tok = build_tokenizer(SMALL_CORPUS, vocab_size=512)
    with pytest.raises(ValueError, match="unknown architecture 'bert'"):
        build_model_config("bert", tok)
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        build_model_config("gpt2", tok, preset="huge")
    with pytest.raises(ValueError, match="unknown architecture 'bert'"):
        build_tiny_model(tmp_path / "x", arch="bert", texts=SMALL_CORPUS)
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        build_tiny_model(tmp_path / "y", preset="huge", texts=SMALL_CORPUS)


def test_preset_sizes():
    tok = build_tokenizer(SMALL_CORPUS, vocab_size=512)
    gpt2 = build_model_config("gpt2", tok, "nano")
    llama = build_model_config("llama", tok, "small")
    assert (gpt2.n_embd, gpt2.n_layer, gpt2.n_head) == (32, 1, 2)
    assert (llama.hidden_size, llama.num_hidden_layers) == (
        PRESETS["small"]["hidden"],
        PRESETS["small"]["layers"],
    )
    assert llama.tie_word_embeddings is False
