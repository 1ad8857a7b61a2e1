"""The reflection learner's gradients on one process: a micro-batch of padding rows still reaches every trainable
parameter (the all-reduce needs it on every process), and who may average them (DDP: yes; DeepSpeed / FSDP: refused
for ``train_policy: false`` with several processes)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import DistributedType

from reflect_trl.prompts import encode_prompts, reflection_prompt
from reflect_trl.trainers.reflection_learner import ReflectionLearner
from reflect_trl.trainers.rl_batch import collate_reflections


@pytest.fixture(scope="module")
def learner(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    return ReflectionLearner(torch.nn.Module(), model, AutoTokenizer.from_pretrained(tiny_model_dir))


def _batch(learner, real: bool) -> dict:
    tok = learner.tokenizer
    rows = [
        SimpleNamespace(
            reflection_prompt_ids=encode_prompts(tok, [reflection_prompt(f"Taxi at row {i}.")])[0],
            reflection_ids=[5, 6, 7][: i + 1],
            reflection_logps=[-7.0, -7.5, -8.0][: i + 1],
            real=real,
        )
        for i in range(3)
    ]
    batch = collate_reflections(rows, tok.pad_token_id, "cpu")
    batch["advantages"] = torch.tensor([1.0, -0.5, 2.0])
    return batch


def test_padding_rows_only_still_give_every_parameter_a_zero_gradient(learner):
    learner.model.zero_grad(set_to_none=True)
    terms, _ = learner.losses(_batch(learner, real=False), 1.0, 0.2, 0.2, beta=0.0)
    loss = terms.policy.sum()
    assert loss.requires_grad, "no graph: backward would fail, and an all-reduce would wait for this process"
    loss.backward()
    assert all(p.grad is not None and not p.grad.any() for p in learner.parameters())
    with torch.no_grad():  # the reference / old log-probs: no forward needed
        logp, _ = learner.token_logps(learner.model, _batch(learner, real=False), 1.0)
    assert not logp.any()


def test_real_rows_are_unchanged_by_the_padding_forward(learner):
    with torch.no_grad():
        logp, _ = learner.token_logps(learner.model, _batch(learner, real=True), 1.0)
    tokens = _batch(learner, real=True)["reflection_token_mask"]
    assert (logp[tokens.bool()] < 0).all() and not logp[~tokens.bool()].any()


@pytest.mark.parametrize("kind", [DistributedType.DEEPSPEED, DistributedType.FSDP])
def test_reflection_only_is_refused_under_deepspeed_and_fsdp(learner, kind):
    with pytest.raises(ValueError, match=r"train_policy=false with 2 processes .* DDP .*train_policy=true"):
        learner.average_gradients(SimpleNamespace(num_processes=2, distributed_type=kind))
    # one process: nothing to average
    learner.average_gradients(SimpleNamespace(num_processes=1, distributed_type=kind))
    assert learner._accelerator is None


@pytest.mark.parametrize("kind", [DistributedType.MULTI_CPU, DistributedType.MULTI_GPU])
def test_reflection_only_averages_its_own_gradients_under_ddp(tiny_model_dir, kind):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    learner = ReflectionLearner(
        torch.nn.Module(),
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        AutoTokenizer.from_pretrained(tiny_model_dir),
    )
    accelerator = SimpleNamespace(num_processes=2, distributed_type=kind)
    learner.average_gradients(accelerator)
    assert learner._accelerator is accelerator
