"""bf16 on CUDA against fp32: the rollout's forwards (shared-prefix KV path at real prompt lengths, the option head,
the reflection model's generate) and the RL loss's forward and backward, within the tolerances of ``_cuda_helpers``."""

from __future__ import annotations

import pytest
import torch
from _cuda_helpers import (
    BF16_LOGIT_ATOL,
    BF16_LOGIT_RTOL,
    BF16_LOGP_ATOL,
    CUDA_MARKS,
    FP32_ATOL,
    GRAD_COSINE_MIN,
    device,
    make_trainer,
    reflection_prompts,
    taxi_prompts,
)

from reflect_trl.action_head import OptionHead, masked_log_probs
from reflect_trl.batching import left_pad, position_ids_from_mask, shared_prefix_forward, shared_prefix_length
from reflect_trl.models import load_causal_lm, load_tokenizer
from reflect_trl.reflection.model import ReflectionModel
from reflect_trl.rl_math import entropy_from_log_probs
from reflect_trl.rollout import PolicyActor

pytestmark = CUDA_MARKS
ARCHS = ["gpt2", "llama"]


def _last_logits(model, ids: list[list[int]], pad_id: int, shared_prefix: bool) -> torch.Tensor:
    """Last-position logits (float32) of the prompts: through the shared-prefix KV path or a plain padded forward."""
    dev = next(model.parameters()).device
    with torch.no_grad():
        prefix = shared_prefix_length(ids, 16) if shared_prefix else 0
        if prefix:
            out = shared_prefix_forward(model, ids, prefix, pad_id, logits_to_keep=1)
        else:
            input_ids, mask = (t.to(dev) for t in left_pad(ids, pad_id))
            out = model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=position_ids_from_mask(mask),
                logits_to_keep=1,
                use_cache=False,
            )
    return out.logits[:, -1, :].float().cpu()


def _option_table(logits: torch.Tensor, head: OptionHead, num_options: list[int]) -> torch.Tensor:
    return masked_log_probs(logits.index_select(-1, head.label_ids), torch.tensor(num_options))


@pytest.mark.parametrize("arch", ARCHS)
def test_policy_forward_on_the_device_matches_the_cpu_and_bf16_stays_within_tolerance(arch, request):
    model_dir = request.getfixturevalue(f"{arch}_dir")
    tok, dev = load_tokenizer(model_dir), device()
    head = OptionHead(tok)
    ids, num_options = taxi_prompts(tok, n=8, reflection_words=40)  # ~300-450 tokens, as the recipes' prompts
    assert shared_prefix_length(ids, 16) >= 16 and max(map(len, ids)) > 250

    cpu = load_causal_lm(model_dir, dtype="float32").eval()
    expected = _option_table(_last_logits(cpu, ids, tok.pad_token_id, shared_prefix=False), head, num_options)
    fp32 = load_causal_lm(model_dir, dtype="float32").to(dev).eval()
    for shared in (True, False):
        got = _option_table(_last_logits(fp32, ids, tok.pad_token_id, shared), head, num_options)
        torch.testing.assert_close(got, expected, atol=FP32_ATOL, rtol=0)

    bf16 = load_causal_lm(model_dir, dtype="bfloat16").to(dev).eval()
    tables = [
        _option_table(_last_logits(bf16, ids, tok.pad_token_id, s), head, num_options) for s in (True, False)
    ]
    # fp32 weights under autocast: the Trainer's bf16 mixed precision
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        tables.append(_option_table(_last_logits(fp32, ids, tok.pad_token_id, True), head, num_options))
    for table in tables:
        finite = expected.isfinite()
        assert torch.equal(table.isfinite(), finite)
        assert (table[finite] - expected[finite]).abs().max() <= BF16_LOGP_ATOL
        assert (
            entropy_from_log_probs(table) - entropy_from_log_probs(expected)
        ).abs().max() <= BF16_LOGP_ATOL

    # the rollout's own actor on the device: same greedy options and log-probs as the CPU
    on_cpu = PolicyActor(cpu, tok, head, greedy=True).act(ids, num_options)
    on_dev = PolicyActor(fp32, tok, head, greedy=True).act(ids, num_options)
    assert on_dev[0] == on_cpu[0]
    assert on_dev[1] == pytest.approx(on_cpu[1], abs=FP32_ATOL)
    options, logps, entropies, _ = PolicyActor(bf16, tok, head, greedy=False).act(ids, num_options)
    assert all(0 <= o < n for o, n in zip(options, num_options, strict=True))
    assert all(lp <= 0 and e >= 0 for lp, e in zip(logps, entropies, strict=True))


@pytest.mark.parametrize("arch", ARCHS)
def test_reflection_generation_on_the_device(arch, request):
    """fp32: the fast path (shared-prefix KV cache + static cache) writes the plain path's greedy reflections on the
    device; bf16: the fast path is taken, the budget holds, and the prefix-cached logits stay within tolerance."""
    model_dir = request.getfixturevalue(f"{arch}_dir")
    tok, dev = load_tokenizer(model_dir), device()
    prompts = reflection_prompts(6)
    fp32 = load_causal_lm(model_dir, dtype="float32", trainable=False).to(dev)
    plain = ReflectionModel(
        fp32,
        tok,
        max_new_tokens=12,
        temperature=0,
        shared_prefix_min_tokens=0,
        cache_implementation="dynamic",
    ).generate(prompts)
    fast_player = ReflectionModel(fp32, tok, max_new_tokens=12, temperature=0)
    fast = fast_player.generate(prompts)
    assert fast_player._fast_path_ok is True
    assert (fast.texts, fast.num_tokens, fast.stopped) == (plain.texts, plain.num_tokens, plain.stopped)

    ids = fast.prompt_ids
    reference = _last_logits(fp32, ids, tok.pad_token_id, shared_prefix=False)
    torch.testing.assert_close(
        _last_logits(fp32, ids, tok.pad_token_id, True), reference, atol=FP32_ATOL, rtol=0
    )
    bf16 = load_causal_lm(model_dir, dtype="bfloat16", trainable=False).to(dev)
    torch.testing.assert_close(
        _last_logits(bf16, ids, tok.pad_token_id, True), reference, atol=BF16_LOGIT_ATOL, rtol=BF16_LOGIT_RTOL
    )
    player = ReflectionModel(bf16, tok, max_new_tokens=12, temperature=1.0)
    batch = player.generate(prompts)
    assert player._fast_path_ok is True
    assert len(batch.texts) == len(prompts) and all(1 <= n <= 12 for n in batch.num_tokens)


@pytest.mark.parametrize("arch", ARCHS)
def test_reflection_generate_on_the_device_is_not_compiled(arch, request, monkeypatch):
    """transformers would torch.compile the forward of a generate with a StaticCache on CUDA (and recompile for every
    turn's batch size and cache length): the reflection player's fast path must stay eager."""
    model_dir = request.getfixturevalue(f"{arch}_dir")
    tok = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir, dtype="bfloat16", trainable=False).to(device())

    def no_compile(*args, **kwargs):
        raise AssertionError("torch.compile was called during a reflection's generate")

    monkeypatch.setattr(torch, "compile", no_compile)
    player = ReflectionModel(model, tok, max_new_tokens=8, temperature=1.0)
    for n in (6, 4, 3):  # the live batch shrinks: new shapes every turn
        assert len(player.generate(reflection_prompts(n)).texts) == n
    assert player._fast_path_ok is True


def _captured_loss_inputs(trainer) -> list[dict]:
    """Wrap ``compute_loss`` on the instance to keep the micro-batches it is given."""
    seen: list[dict] = []
    original = trainer.compute_loss

    def compute_loss(model, inputs, *args, **kwargs):
        seen.append(dict(inputs))
        return original(model, inputs, *args, **kwargs)

    trainer.compute_loss = compute_loss
    return seen


def _loss_and_grads(trainer, inputs: dict) -> tuple[float, torch.Tensor]:
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(model, inputs)
    loss.backward()
    grads = [p.grad.float().flatten() for p in model.parameters() if p.requires_grad and p.grad is not None]
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), torch.cat(grads).cpu()


def test_rl_loss_forward_and_backward_in_bf16_match_fp32(gpt2_dir, tmp_path):
    """The trainer's loss (``compute_loss``, forward and backward) on one rollout batch: fp32 weights, bf16 weights
    (the recipes' ``dtype: bfloat16``) and fp32 weights under bf16 autocast agree within tolerance."""
    common = dict(max_steps=1, learning_rate=0.0, entropy_coef=0.1, reflection_max_new_tokens=6)
    reference = make_trainer(gpt2_dir, tmp_path / "fp32", dtype="float32", bf16=False, **common)
    batches = _captured_loss_inputs(reference)
    reference.train()  # learning rate 0: the weights stay those of the checkpoint
    inputs = batches[0]
    assert all(v.device.type == device().type for v in inputs.values() if isinstance(v, torch.Tensor))
    want_loss, want_grad = _loss_and_grads(reference, inputs)
    assert want_grad.norm() > 0
    for name, dtype in (("bf16 weights", "bfloat16"), ("bf16 autocast", "float32")):
        trainer = make_trainer(gpt2_dir, tmp_path / name.replace(" ", "_"), dtype=dtype, bf16=True, **common)
        loss, grad = _loss_and_grads(trainer, inputs)
        assert loss == pytest.approx(want_loss, abs=1e-2, rel=2e-2), name
        cosine = torch.nn.functional.cosine_similarity(grad, want_grad, dim=0)
        assert cosine >= GRAD_COSINE_MIN, (name, float(cosine))
        assert grad.norm() == pytest.approx(float(want_grad.norm()), rel=5e-2), name
