"""ReflectPPOTrainer's loss against hand-computed objectives, through the GRPOTrainer hooks it relies on.

The hand computation below uses only the model's forward pass and the equations of ``reflect_trl.rl_math``: if
the trainer's loss path, GRPOTrainer's buffering in ``_prepare_inputs`` or its splitting into micro-batches changes
behaviour, these tests fail. The 2-process version is ``tests/trainers/ddp_loss_script.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import trl
from packaging.version import Version
from transformers import TrainerCallback

from reflect_trl.envs import make_env
from reflect_trl.models import load_causal_lm, load_tokenizer
from reflect_trl.prompts import build_prompt, encode_prompts
from reflect_trl.trainers.rl_config import ReflectPPOConfig
from reflect_trl.trainers.rl_tasks import tasks_to_dataset
from reflect_trl.trainers.rl_trainer import ReflectPPOTrainer

ROOT = Path(__file__).resolve().parents[2]


class StopAtStep(TrainerCallback):
    """Stops training after optimizer step ``step`` (a run killed after its checkpoint, for the resume tests)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.step:
            control.should_training_stop = True


def make_trainer(
    model_dir: str,
    out_dir,
    reflection_tokenizer: bool = False,
    trainer_kwargs: dict | None = None,
    **overrides,
) -> ReflectPPOTrainer:
    """A trainer on 4 training tasks per Taxi stage; ``overrides`` are ReflectPPOConfig fields, ``trainer_kwargs``
    more arguments of ReflectPPOTrainer (a reflection model, a peft_config)."""
    env = make_env("taxi")
    tasks = [
        t for s in ("pickup", "dropoff", "full") for t in env.make_tasks("train", 4, seed=0, difficulty=s)
    ]
    kwargs = dict(
        output_dir=str(out_dir),
        per_device_train_batch_size=4,
        num_generations=2,
        max_steps=3,
        learning_rate=1e-3,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        seed=0,
    )
    kwargs.update(overrides)
    return ReflectPPOTrainer(
        model=load_causal_lm(model_dir),
        args=ReflectPPOConfig(**kwargs),
        train_dataset=tasks_to_dataset(tasks),
        processing_class=load_tokenizer(model_dir),
        **{
            "reflection_tokenizer": load_tokenizer(model_dir) if reflection_tokenizer else None,
            **(trainer_kwargs or {}),
        },
    )


def hand_batch(tokenizer, n_rows: int, n_real: int, seed: int) -> dict[str, torch.Tensor]:
    """``n_rows`` turn samples of real DangerousTaxi prompts (the last ``n_rows - n_real`` are padding rows), with
    old log-probs far from the current ones (of an untrained model) so that ratios leave the clip range on both sides."""
    g = torch.Generator().manual_seed(seed)
    env = make_env("taxi")
    texts, num_options = [], []
    for task in env.make_tasks("train", n_rows, seed=seed, difficulty="full"):
        obs = env.reset(task=task)
        texts.append(build_prompt(obs.text, obs.actions).text)
        num_options.append(len(obs.actions))
    ids = encode_prompts(tokenizer, texts)
    width = max(len(x) for x in ids)
    prompt_ids = torch.full((n_rows, width), tokenizer.pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((n_rows, width), dtype=torch.long)
    for i, x in enumerate(ids):
        prompt_ids[i, width - len(x) :] = torch.tensor(x)
        prompt_mask[i, width - len(x) :] = 1
    num_options_t = torch.tensor(num_options)
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "option": torch.randint(0, 6, (n_rows,), generator=g) % num_options_t,
        "num_options": num_options_t,
        "advantages": torch.randn(n_rows, generator=g) * 2,
        # an untrained tiny model gives each of 6 options ~1/6: these old probabilities put ratios on both sides
        "old_logps": torch.log(torch.tensor([0.05, 0.5, 0.1, 0.3, 0.17, 0.02] * n_rows)[:n_rows]),
        "returns": torch.randn(n_rows, generator=g),
        "old_values": torch.randn(n_rows, generator=g) * 0.1,
        "turn_mask": torch.tensor([1.0] * n_real + [0.0] * (n_rows - n_real)),
        "value_mask": torch.ones(n_rows),
        "stage_index": torch.tensor(0.0),
    }


def set_window(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The window counts ``_prepare_inputs`` writes, for a batch that is its own accumulation window (1 process)."""
    batch["window_turns"] = batch["turn_mask"].sum()
    batch["window_value_turns"] = (batch["value_mask"] * batch["turn_mask"]).sum()
    return batch


def reference_tables(model, label_ids, batch, shift: float = 0.3) -> torch.Tensor:
    """A reference option table that differs from the policy's: its log-softmax with option 0 raised by ``shift``."""
    with torch.no_grad():
        table = hand_tables(model, label_ids, batch)
    bonus = torch.zeros_like(table)
    bonus[:, 0] = shift
    return torch.log_softmax(table + bonus, dim=-1)


def hand_tables(model, label_ids, batch, temperature: float = 1.0) -> torch.Tensor:
    """log pi(. | prompt) over the offered options (-inf elsewhere), from a plain forward pass."""
    mask = batch["prompt_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=batch["prompt_ids"], attention_mask=mask, position_ids=positions).logits[
        :, -1, :
    ]
    z = logits[:, label_ids] / temperature
    offered = torch.arange(len(label_ids))[None, :] < batch["num_options"][:, None]
    return torch.log_softmax(z.masked_fill(~offered, float("-inf")), dim=-1)


def hand_logps(model, label_ids, batch, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(option | prompt) over the offered options and the entropy, from a plain forward pass."""
    log_p = hand_tables(model, label_ids, batch, temperature)
    p = log_p.exp()
    entropy = -(p * log_p.masked_fill(p == 0, 0.0)).sum(-1)
    return log_p.gather(-1, batch["option"][:, None]).squeeze(-1), entropy


def hand_kl(tables, batch) -> torch.Tensor:
    """The KL term of each turn: the exact KL(pi || pi_ref) over the offered options, by a loop over them."""
    rows = []
    for i in range(tables.shape[0]):
        n = int(batch["num_options"][i])
        p, lp, lr = tables[i, :n].exp(), tables[i, :n], batch["ref_log_probs"][i, :n]
        rows.append((p * (lp - lr)).sum())
    return torch.stack(rows)


def hand_objective(logp, entropy, batch, eps=0.2, beta=0.0, ent_coef=0.0, tables=None) -> torch.Tensor:
    """1/N sum over real turns of -min(r A, clip(r) A) + beta KL - c_H H (``tables``: the policy's option tables, for
    the KL)."""
    ratio = torch.exp(logp - batch["old_logps"])
    adv = batch["advantages"]
    per_turn = -torch.min(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv) - ent_coef * entropy
    if beta:
        per_turn = per_turn + beta * hand_kl(tables, batch)
    real = batch["turn_mask"] > 0
    return per_turn[real].mean()


def test_trl_minor_is_the_tested_one():
    assert Version("1.16") <= Version(trl.__version__) < Version("1.17"), trl.__version__


def test_loss_equals_the_hand_computed_clipped_objective(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tmp_path)
    trainer.model.train()
    batch = hand_batch(trainer._tokenizer, n_rows=6, n_real=5, seed=1)
    batch["advantages"][5] = 1e3  # a padding row must not count
    set_window(batch)
    assert batch["window_turns"].item() == 5

    loss = trainer.compute_loss(trainer.model, batch)
    logp, entropy = hand_logps(trainer.model, trainer.option_head.label_ids, batch)
    expected = hand_objective(logp, entropy, batch)
    ratio = torch.exp(logp - batch["old_logps"])[:5]
    assert (ratio < 0.8).any() and (ratio > 1.2).any(), "the batch must exercise both sides of the clip"
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)

    params = [p for p in trainer.model.parameters() if p.requires_grad]
    got = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    want = torch.autograd.grad(expected, params, allow_unused=True)
    for g, w in zip(got, want, strict=True):
        if w is None:
            assert g is None or torch.count_nonzero(g) == 0
        else:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    logged = trainer._metrics["train"]
    clipped = ((ratio < 0.8) | (ratio > 1.2)).float().mean().item()
    assert logged["clip_fraction"][-1] == pytest.approx(clipped)
    approx_kl = ((ratio - 1) - torch.log(ratio)).mean().item()
    assert logged["approx_kl"][-1] == pytest.approx(approx_kl, rel=1e-4)
    assert logged["entropy"][-1] == pytest.approx(entropy[:5].mean().item(), rel=1e-4)


def test_kl_and_entropy_terms(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tmp_path, beta=0.3, entropy_coef=0.05)
    assert trainer.ref_model is not None
    trainer.model.train()
    batch = hand_batch(trainer._tokenizer, n_rows=4, n_real=4, seed=2)
    batch["ref_log_probs"] = reference_tables(trainer.model, trainer.option_head.label_ids, batch)
    set_window(batch)
    loss = trainer.compute_loss(trainer.model, batch)
    logp, entropy = hand_logps(trainer.model, trainer.option_head.label_ids, batch)
    tables = hand_tables(trainer.model, trainer.option_head.label_ids, batch)
    assert hand_kl(tables, batch).min() > 1e-4, "the reference must differ from the policy"
    expected = hand_objective(logp, entropy, batch, beta=0.3, ent_coef=0.05, tables=tables)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    assert "kl" in trainer._metrics["train"]


def test_value_loss_is_the_clipped_one_over_value_turns(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tmp_path, advantage_estimator="gae", vf_coef=0.5, value_clip=0.2)
    trainer.model.train()
    with torch.no_grad():
        trainer.value_head.bias.fill_(0.3)  # V = 0.3 everywhere (zero weights)
    batch = hand_batch(trainer._tokenizer, n_rows=5, n_real=4, seed=3)
    batch["value_mask"] = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0])  # row 2: a replayed turn, row 4: padding
    set_window(batch)
    assert batch["window_value_turns"].item() == 3
    loss = trainer.compute_loss(trainer.model, batch)
    logp, entropy = hand_logps(trainer.model, trainer.option_head.label_ids, batch)
    v, v_old, ret = torch.full((5,), 0.3), batch["old_values"], batch["returns"]
    v_clipped = v_old + (v - v_old).clamp(-0.2, 0.2)
    per_turn_v = 0.5 * torch.maximum((v - ret) ** 2, (v_clipped - ret) ** 2)
    expected = hand_objective(logp, entropy, batch) + 0.5 * per_turn_v[[0, 1, 3]].mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    assert "explained_variance" in trainer._metrics["train"]


def test_accumulation_window_sums_to_the_mean_over_all_real_turns(tiny_model_dir, tmp_path, monkeypatch):
    """Through GRPOTrainer._prepare_inputs (generate once, shuffle, split into steps_per_generation micro-batches):
    two micro-batches of one accumulation window, with different numbers of real turns, sum to the mean over
    all the window's real turns."""
    trainer = make_trainer(
        tiny_model_dir, tmp_path, gradient_accumulation_steps=2, per_device_train_batch_size=4
    )
    assert trainer.args.steps_per_generation == 2
    trainer.model.train()
    batch = hand_batch(trainer._tokenizer, n_rows=8, n_real=5, seed=4)
    monkeypatch.setattr(trainer, "_generate_and_score_completions", lambda inputs: dict(batch))
    trainer._buffered_inputs = None
    total = 0.0
    seen_real = 0
    for micro_step in range(2):
        trainer._step = micro_step
        chunk = trainer._prepare_inputs([{}] * 8)
        assert chunk["prompt_ids"].shape[0] == 4
        assert chunk["window_turns"].item() == 5
        seen_real += int(chunk["turn_mask"].sum().item())
        total += trainer.compute_loss(trainer.model, chunk).item()
    assert seen_real == 5
    logp, entropy = hand_logps(trainer.model, trainer.option_head.label_ids, batch)
    assert total == pytest.approx(hand_objective(logp, entropy, batch).item(), rel=1e-5, abs=1e-6)


def test_config_refuses_grpo_options_that_do_not_apply():
    common = dict(output_dir="/tmp/x", use_cpu=True, bf16=False)
    for bad, match in (
        ({"loss_type": "dapo"}, "loss_type='dapo'"),
        ({"use_vllm": True}, "use_vllm=True"),
        ({"top_p": 0.9}, "top_p=0.9"),
        ({"top_entropy_quantile": 0.5}, "top_entropy_quantile"),
        (
            {"advantage_estimator": "rloo", "scale_rewards": "none"},
            "applies to advantage_estimator='gigpo' only",
        ),
        ({"gradient_accumulation_steps": 2, "steps_per_generation": 3}, "multiple of"),
        ({"max_completion_length": 8}, "max_completion_length=8"),
    ):
        with pytest.raises(ValueError, match=match):
            ReflectPPOConfig(**common, **bad)
    assert (
        ReflectPPOConfig(**common, advantage_estimator="gigpo", scale_rewards="none").scale_rewards == "none"
    )


@pytest.mark.distributed
def test_two_process_gradient_equals_the_global_mean(tiny_model_dir, tmp_path):
    """2 gloo processes with different numbers of real turns: the DDP-averaged gradient equals the gradient of the
    mean objective over the real turns of both processes, computed by hand on one process."""
    out = tmp_path / "ddp_loss"
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ROOT / "recipes/accelerate_configs/cpu_ddp.yaml"),
        str(ROOT / "tests/trainers/ddp_loss_script.py"),
        tiny_model_dir,
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for record in records:
        assert record["world_size"] == 2
        assert record["window_turns"] == 6  # 5 real turns on rank 0, 1 on rank 1
        assert record["max_grad_diff"] < 1e-5, record
        assert record["grad_norm"] > 0


def test_moe_router_loss_is_added(tiny_model_dir, tmp_path):
    """A Mixture-of-Experts policy: the trainer asks for the router logits and adds router_aux_loss_coef x the
    load-balancing loss of the same forward (GRPO's own MoE handling is bypassed by the custom loss)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    tokenizer = load_tokenizer(tiny_model_dir)
    config = MixtralConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, output_router_logits=True,
        router_aux_loss_coef=0.02, max_position_embeddings=1024, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    moe_dir = tmp_path / "moe"
    MixtralForCausalLM(config).save_pretrained(moe_dir)
    tokenizer.save_pretrained(moe_dir)
    trainer = make_trainer(str(moe_dir), tmp_path / "out")
    assert trainer.aux_loss_enabled and trainer.router_aux_loss_coef == pytest.approx(0.02)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    batch = hand_batch(trainer._tokenizer, n_rows=4, n_real=4, seed=5)
    set_window(batch)
    loss = trainer.compute_loss(trainer.model, batch)
    logp, entropy = hand_logps(trainer.model, trainer.option_head.label_ids, batch)
    mask = batch["prompt_mask"]
    aux = trainer.model(
        input_ids=batch["prompt_ids"], attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
        output_router_logits=True, logits_to_keep=1,
    ).aux_loss  # fmt: skip
    assert aux.item() > 0
    expected = hand_objective(logp, entropy, batch) + 0.02 * aux
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    assert trainer._metrics["train"]["aux_loss"]


@pytest.mark.parametrize("model_fixture", ["tiny_model_dir", "tiny_llama_dir"])
def test_shared_prefix_forward_gives_the_plain_forwards_loss_and_gradients(model_fixture, request, tmp_path):
    """The loss forward encodes the turn prompts' common prefix once (batch size 1) and runs only the suffixes at
    full batch size: the model sees shorter inputs, and the loss, its gradients and the old / reference log-probs
    equal those of plain left-padded forwards (``shared_prefix_min_tokens=0``) up to float rounding."""
    model_dir = request.getfixturevalue(model_fixture)
    results = {}
    for min_tokens in (16, 0):
        trainer = make_trainer(
            model_dir, tmp_path / str(min_tokens), beta=0.1, shared_prefix_min_tokens=min_tokens
        )
        trainer.model.train()
        batch = hand_batch(trainer._tokenizer, n_rows=6, n_real=6, seed=7)
        widths: list[int] = []
        hook = trainer.model.register_forward_pre_hook(
            lambda _m, args, kwargs, _w=widths: _w.append(kwargs["input_ids"].shape[1]), with_kwargs=True
        )
        with torch.no_grad():
            tables = trainer._option_tables(trainer.model, batch, torch.ones(6, dtype=torch.bool))
            old = tables.gather(-1, batch["option"][:, None]).squeeze(-1)
        batch["ref_log_probs"] = torch.log_softmax(tables + 0.1 * torch.arange(tables.shape[1]), dim=-1)
        set_window(batch)
        loss = trainer.compute_loss(trainer.model, batch)
        hook.remove()
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        results[min_tokens] = (widths, old, loss.detach(), grads)
    (
        (shared_widths, shared_old, shared_loss, shared_grads),
        (plain_widths, plain_old, plain_loss, plain_grads),
    ) = (
        results[16],
        results[0],
    )
    full_width = batch["prompt_ids"].shape[1]
    assert set(plain_widths) == {full_width}
    # per scoring: one batch-1 prefix forward, then one suffix forward of (much) fewer columns
    assert len(shared_widths) == 2 * len(plain_widths)
    prefix_width, suffix_width = shared_widths[0], shared_widths[1]
    assert prefix_width >= 16 and suffix_width + prefix_width <= full_width
    torch.testing.assert_close(shared_old, plain_old, rtol=1e-5, atol=1e-5)
    assert shared_loss.item() == pytest.approx(plain_loss.item(), rel=1e-5, abs=1e-6)
    for g, w in zip(shared_grads, plain_grads, strict=True):
        if w is not None:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_shared_prefix_is_off_with_gradient_checkpointing(tiny_model_dir, tmp_path):
    """Activation checkpointing re-runs layers without their KV cache: under autograd the loss forward is a plain
    one (full width), without gradients (old / reference scoring) the prefix is still shared."""
    trainer = make_trainer(tiny_model_dir, tmp_path, gradient_checkpointing=True)
    trainer.model.train()
    batch = hand_batch(trainer._tokenizer, n_rows=4, n_real=4, seed=8)
    widths: list[int] = []
    hook = trainer.model.register_forward_pre_hook(
        lambda _m, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    trainer._option_scores(trainer.model, batch)
    assert widths == [batch["prompt_ids"].shape[1]], "one plain forward over the whole prompts"
    widths.clear()
    with torch.no_grad():
        trainer._option_scores(trainer.model, batch)
    hook.remove()
    assert len(widths) == 2 and sum(widths) <= batch["prompt_ids"].shape[1], "prefix once, then the suffixes"
    with pytest.raises(ValueError, match="shared_prefix_min_tokens must be >= 0"):
        ReflectPPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, shared_prefix_min_tokens=-1)
