"""bitsandbytes 8-bit and 4-bit players on CUDA: loading through ``reflect_trl.models`` and a LoRA RL step on them."""

from __future__ import annotations

import math

import pytest
import torch
from _cuda_helpers import CUDA_MARKS, device, logged, make_trainer, reflection_prompts

from reflect_trl.models import load_causal_lm, load_tokenizer, quantization_config
from reflect_trl.reflection.model import ReflectionModel

pytestmark = CUDA_MARKS


def _quantized_layers(model, bits: int) -> int:
    import bitsandbytes as bnb

    kind = bnb.nn.Linear8bitLt if bits == 8 else bnb.nn.Linear4bit
    return sum(isinstance(m, kind) for m in model.modules())


def _quantized(model_dir: str, bits: int, trainable: bool):
    q = quantization_config(load_in_8bit=bits == 8, load_in_4bit=bits == 4)
    model = load_causal_lm(model_dir, dtype="bfloat16", trainable=trainable, quantization=q)
    assert _quantized_layers(model, bits) > 0
    assert getattr(model, f"is_loaded_in_{bits}bit", False)
    assert next(model.parameters()).device.type == device().type  # bitsandbytes places it on the current GPU
    return model


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_reflection_model_generates(gpt2_dir, bits):
    tok = load_tokenizer(gpt2_dir)
    player = ReflectionModel(
        _quantized(gpt2_dir, bits, trainable=False), tok, max_new_tokens=10, temperature=0
    )
    batch = player.generate(reflection_prompts(6))
    assert player._fast_path_ok is True, "the shared-prefix / static-cache path works on the quantized model"
    assert len(batch.texts) == 6 and all(1 <= n <= 10 for n in batch.num_tokens)


@pytest.mark.parametrize("bits", [8, 4])
def test_lora_rl_step_on_a_quantized_policy_and_reflection_model(gpt2_dir, tmp_path, bits):
    from peft import LoraConfig

    trainer = make_trainer(
        gpt2_dir,
        tmp_path,
        policy=_quantized(gpt2_dir, bits, trainable=True),
        reflection_model=_quantized(gpt2_dir, bits, trainable=False),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj"], task_type="CAUSAL_LM"),
        max_steps=2,
        learning_rate=1e-2,
    )
    lora = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert lora and all("lora_" in n for n in lora), "only the adapter trains"
    trainer.train()
    losses = logged(trainer, "loss")
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(after[n].detach(), p) for n, p in lora.items()), (
        "the LoRA step moved the adapter"
    )
    assert all(after[n].device.type == device().type for n in lora)
    assert _quantized_layers(trainer.model, bits) > 0, "the base stays quantized"
