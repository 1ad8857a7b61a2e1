"""Model/tokenizer loading from local dirs, PEFT adapter dirs (trainable and merged), quantization config."""

from __future__ import annotations

import json

import pytest
import torch

from reflect_trl.models import (
    base_model_of,
    is_adapter_dir,
    load_causal_lm,
    load_tokenizer,
    quantization_config,
)


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir, tmp_path_factory) -> str:
    """A LoRA adapter (non-zero weights, so merging changes the base) saved with ``save_pretrained``."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = load_causal_lm(tiny_model_dir)
    model = get_peft_model(
        base, LoraConfig(r=2, target_modules=["c_attn"], fan_in_fan_out=True, init_lora_weights=False)
    )
    out = tmp_path_factory.mktemp("adapter")
    model.save_pretrained(out)
    return str(out)


def _logits(model, tokenizer, text: str = "Taxi at row 2, col 2.\n# Action:\n") -> torch.Tensor:
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits[0, -1]


def test_load_local_model_and_tokenizer(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    assert tok.padding_side == "left" and tok.truncation_side == "left" and tok.pad_token == "<pad>"
    assert load_tokenizer(tiny_model_dir, padding_side="right").padding_side == "right"
    model = load_causal_lm(tiny_model_dir, dtype="float32")
    assert model.config.model_type == "gpt2" and model.dtype == torch.float32
    assert all(p.requires_grad for p in model.parameters())
    assert not is_adapter_dir(tiny_model_dir) and base_model_of(tiny_model_dir) == tiny_model_dir
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        load_causal_lm(tiny_model_dir, dtype="float8")


def test_adapter_dir_loads_on_its_base(tiny_model_dir, adapter_dir):
    from peft import PeftModel

    assert is_adapter_dir(adapter_dir)
    assert base_model_of(adapter_dir) == tiny_model_dir
    tok = load_tokenizer(adapter_dir)  # no tokenizer files there: falls back to the base
    assert tok.get_vocab() == load_tokenizer(tiny_model_dir).get_vocab()

    trainable = load_causal_lm(adapter_dir, trainable=True)
    assert isinstance(trainable, PeftModel)
    names = [n for n, p in trainable.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names), "only the adapter is trainable"

    frozen = load_causal_lm(adapter_dir, trainable=False)
    assert isinstance(frozen, PeftModel) and not any(p.requires_grad for p in frozen.parameters())

    merged = load_causal_lm(adapter_dir, merge_adapter=True)
    assert not isinstance(merged, PeftModel)
    assert not any("lora_" in n for n, _ in merged.named_parameters())

    base = load_causal_lm(tiny_model_dir)
    with_adapter = _logits(trainable, tok)
    torch.testing.assert_close(_logits(merged, tok), with_adapter, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(_logits(base, tok), with_adapter, atol=1e-4), "the adapter changes the model"


def test_adapter_without_base_is_an_error(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    with pytest.raises(ValueError, match="has no base_model_name_or_path"):
        base_model_of(str(tmp_path))


def test_quantization_config():
    assert quantization_config() is None
    with pytest.raises(ValueError, match="not both"):
        quantization_config(load_in_8bit=True, load_in_4bit=True)
    four = quantization_config(load_in_4bit=True, compute_dtype="float16")
    assert (
        four.load_in_4bit
        and four.bnb_4bit_quant_type == "nf4"
        and four.bnb_4bit_compute_dtype == torch.float16
    )
    assert quantization_config(load_in_8bit=True).load_in_8bit
