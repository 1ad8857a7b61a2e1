"""The reflection player as a second learner (``train_reflection``): its loss by hand, its learning sign, its own
learning rate, both checkpoints, an exact resume, LoRA on both players, the reflection-only mode."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from test_rl_loss import StopAtStep, make_trainer

from reflect_trl.models import load_causal_lm, load_tokenizer
from reflect_trl.trainers.rl_config import ReflectPPOConfig
from reflect_trl.trainers.rl_trainer import ReflectPPOTrainer


def _trainer(model_dir, out_dir, peft_config=None, **overrides) -> ReflectPPOTrainer:
    """A both-players trainer: sampled 6-token reflections of a learning reflection model (its own copy)."""
    config = dict(
        logging_steps=1,
        reflection_max_new_tokens=6,
        reflection_temperature=1.0,
        train_reflection=True,
        reflection_learning_rate=1e-2,
        advantage_estimator="rloo",
    )
    extra = dict(
        reflection_model=load_causal_lm(model_dir),
        reflection_tokenizer=load_tokenizer(model_dir),
        peft_config=peft_config,
    )
    return make_trainer(model_dir, out_dir, trainer_kwargs=extra, **{**config, **overrides})


def _window(batch):
    batch["window_turns"] = batch["turn_mask"].sum()
    batch["window_value_turns"] = torch.zeros(())
    return batch


def _hand_token_logps(model, batch) -> torch.Tensor:
    """log phi of every generated token, from a full forward (no logits_to_keep), by a loop over rows."""
    ids, mask, tokens = batch["reflection_ids"], batch["reflection_mask"], batch["reflection_token_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    log_probs = (
        model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float().log_softmax(-1)
    )
    out = torch.zeros(ids.shape)
    for i in range(ids.shape[0]):
        for j in range(1, ids.shape[1]):
            if tokens[i, j]:
                out[i, j] = log_probs[i, j - 1, ids[i, j]]
    return out


def test_the_rollout_records_each_reflection_token_and_its_sampling_logprob(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path)
    trainer.model.train()
    batch = trainer._generate_and_score_completions([{}] * 4)
    tokens = batch["reflection_token_mask"]
    real = batch["turn_mask"].bool()
    assert tokens[real].sum(-1).min() >= 1 and tokens[~real].sum() == 0
    with torch.no_grad():
        hand = _hand_token_logps(trainer.reflection_learner.model, batch)
    # the rollout's log-probs (generate's processed scores) are those of a teacher-forced forward
    torch.testing.assert_close(batch["old_reflection_logps"] * tokens, hand * tokens, rtol=0, atol=1e-4)
    assert (batch["old_reflection_logps"][tokens.bool()] < 0).all()


def test_reflection_loss_equals_the_hand_computed_token_objective(tiny_model_dir, tmp_path):
    """train_policy false: the loss is the reflection's alone -- per turn the mean over its tokens of the clipped
    surrogate plus beta_R k3, averaged over the real turns."""
    trainer = _trainer(tiny_model_dir, tmp_path, train_policy=False, reflection_beta=0.3)
    trainer.model.train()
    batch = _window(trainer._generate_and_score_completions([{}] * 4))
    g = torch.Generator().manual_seed(0)
    batch["advantages"] = torch.randn(batch["advantages"].shape, generator=g)
    tokens = batch["reflection_token_mask"]
    batch["old_reflection_logps"] = (
        batch["old_reflection_logps"] + 0.3 * torch.randn(tokens.shape, generator=g) * tokens
    )
    loss = trainer.compute_loss(trainer.model, batch)
    model = trainer.reflection_learner.model
    logp = _hand_token_logps(model, batch)
    with torch.no_grad():
        ref = _hand_token_logps(trainer.reflection_learner.reference, batch)
    ratio = torch.exp(logp - batch["old_reflection_logps"])
    adv = batch["advantages"][:, None]
    surrogate = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    k3 = torch.exp(ref - logp) - (ref - logp) - 1
    n = tokens.sum(-1).clamp(min=1)
    per_turn = ((surrogate + 0.3 * k3) * tokens).sum(-1) / n
    real = (batch["turn_mask"] > 0) & (tokens.sum(-1) > 0)
    expected = per_turn[real].sum() / batch["turn_mask"].sum()
    assert ((ratio < 0.8) | (ratio > 1.2))[tokens.bool()].any(), "the batch must exercise the clip"
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    params = [p for p in model.parameters() if p.requires_grad]
    got = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    want = torch.autograd.grad(expected, params, allow_unused=True)
    for a, b in zip(got, want, strict=True):
        if b is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    policy_params = [p for n, p in trainer.model.named_parameters() if "reflect_reflection" not in n]
    assert not any(p.requires_grad for p in policy_params), "train_policy false freezes the policy"
    logged = trainer._metrics["train"]
    assert {"reflection/policy_loss", "reflection/kl", "reflection/entropy"} <= set(logged)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_turn_advantage_moves_its_reflection_tokens_logprob_its_way(tiny_model_dir, tmp_path, sign):
    trainer = _trainer(tiny_model_dir, tmp_path, train_policy=False, reflection_beta=0.0)
    trainer.model.train()
    batch = _window(trainer._generate_and_score_completions([{}] * 4))
    tokens = batch["reflection_token_mask"]
    batch["advantages"] = torch.zeros_like(batch["advantages"])
    batch["advantages"][0] = sign
    model = trainer.reflection_learner.model
    with torch.no_grad():
        before = (_hand_token_logps(model, batch)[0] * tokens[0]).sum()
    loss = trainer.compute_loss(trainer.model, batch)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.5 * p.grad
        after = (_hand_token_logps(model, batch)[0] * tokens[0]).sum()
    assert (after - before) * sign > 0, (before, after)


def test_the_reflection_has_its_own_learning_rate_and_both_players_are_saved(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, learning_rate=1e-3, reflection_learning_rate=2e-2)
    start = copy.deepcopy(trainer.reflection_learner.model.state_dict())
    trainer.train()
    mine = {id(p) for p in trainer.reflection_learner.parameters()}
    rates = {
        ("reflection" if any(id(p) in mine for p in g["params"]) else "policy"): g["lr"]
        for g in trainer.optimizer.param_groups
    }
    assert rates == {"policy": 1e-3, "reflection": 2e-2}
    moved = [
        k for k, v in trainer.reflection_learner.model.state_dict().items() if not torch.equal(v, start[k])
    ]
    assert moved, "the reflection player learned"
    trainer.save_model()
    saved = load_causal_lm(str(tmp_path / "reflection"), trainable=False)
    for k, v in saved.state_dict().items():
        torch.testing.assert_close(v, trainer.reflection_learner.model.state_dict()[k])
    policy_keys = (
        json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
        if (tmp_path / "model.safetensors.index.json").is_file()
        else None
    )
    from safetensors.torch import load_file

    keys = set(policy_keys or load_file(str(tmp_path / "model.safetensors")))
    assert keys and not any("reflect_reflection" in k for k in keys), (
        "the policy's weights hold no reflection"
    )


def test_resume_restores_both_players_exactly(tiny_model_dir, tmp_path):
    common = dict(max_steps=4, save_strategy="steps", save_steps=2)
    full = _trainer(tiny_model_dir, tmp_path / "full", **{**common, "save_strategy": "no"})
    full.train()
    first = _trainer(tiny_model_dir, tmp_path / "part", **common)

    first.add_callback(StopAtStep(2))  # killed after the checkpoint at step 2
    first.train()
    ckpt = tmp_path / "part" / "checkpoint-2"
    assert (ckpt / "reflection_state.pt").is_file() and (ckpt / "reflection" / "config.json").is_file()
    resumed = _trainer(tiny_model_dir, tmp_path / "part", **common)
    resumed.train(resume_from_checkpoint=str(ckpt))
    for key in ("loss", "reflection/policy_loss", "env/success_rate"):
        want = [h[key] for h in full.state.log_history if key in h and h["step"] > 2]
        got = [h[key] for h in resumed.state.log_history if key in h and h["step"] > 2]
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6), key
    a, b = full.reflection_learner.model.state_dict(), resumed.reflection_learner.model.state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_lora_on_both_players(tiny_llama_dir, tmp_path):
    from peft import LoraConfig

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = _trainer(tiny_llama_dir, tmp_path, peft_config=config, max_steps=3)
    learner = trainer.reflection_learner
    assert learner.reference is None and hasattr(learner.model, "disable_adapter")
    trainable = [n for n, p in learner.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    trainer.train()
    assert any(h.get("reflection/kl", 0) > 0 for h in trainer.state.log_history), (
        "the adapter moved from its base"
    )
    trainer.save_model()
    merged = load_causal_lm(str(tmp_path / "reflection"), trainable=False)
    assert not hasattr(merged, "peft_config")


def test_train_reflection_is_checked():
    common = dict(output_dir="/tmp/x", use_cpu=True, bf16=False, train_reflection=True)
    with pytest.raises(ValueError, match="reflection_temperature > 0"):
        ReflectPPOConfig(**common, reflection_temperature=0.0)
    with pytest.raises(ValueError, match="reflection_backend must be 'hf'"):
        ReflectPPOConfig(
            **common, reflection_backend="openai", reflection_base_url="http://127.0.0.1:1/v1",
            reflection_server_model="m",
        )  # fmt: skip
    with pytest.raises(ValueError, match="leaves nothing to train"):
        ReflectPPOConfig(output_dir="/tmp/x", use_cpu=True, bf16=False, train_policy=False)


def test_a_policy_adapter_gives_the_learning_reflection_the_same_lora(tiny_llama_dir, tmp_path):
    """RL that continues an SFT adapter passes no peft_config: the reflection player takes the policy's LoRA settings
    (not all of its weights, with a full copy as reference)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    policy = get_peft_model(load_causal_lm(tiny_llama_dir), config)
    trainer = _trainer(tiny_llama_dir, tmp_path, max_steps=3)
    trainer = ReflectPPOTrainer(
        model=policy,
        args=trainer.args,
        train_dataset=trainer.train_dataset,
        processing_class=load_tokenizer(tiny_llama_dir),
        reflection_model=load_causal_lm(tiny_llama_dir),
    )
    learner = trainer.reflection_learner
    assert learner.reference is None, "its reference is the adapter disabled"
    trainable = [n for n, p in learner.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert learner.model.peft_config["default"].r == 2
