"""Shared pieces of the CUDA tests (``pytest -m cuda``; run by ``make gpu-check``).

Every module here is marked ``cuda`` and skips without a CUDA device. ``REFLECT_TRL_CUDA_TESTS_ON_CPU=1`` runs the
tests' logic on the CPU instead, to debug a test without a GPU: no CUDA kernel runs then, so it proves nothing
about CUDA (tests that need CUDA itself or two devices still skip)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from reflect_trl.envs import make_env
from reflect_trl.prompts import build_prompt, encode_prompts, reflection_prompt

HAS_CUDA = torch.cuda.is_available()
ON_CPU = os.environ.get("REFLECT_TRL_CUDA_TESTS_ON_CPU") == "1" and not HAS_CUDA

#: ``pytestmark`` of every CUDA test module: selected by ``-m cuda``, skipped (not failed) without a device.
CUDA_MARKS = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not (HAS_CUDA or ON_CPU), reason="needs a CUDA device (pytest -m cuda, make gpu-check)"
    ),
]

# Tolerances of bf16 against fp32 (stated in docs/performance.md, "GPU"): bf16 keeps 8 bits of mantissa, a relative
# rounding of 2^-8 ~ 0.4 % per operation.
BF16_LOGP_ATOL = 5e-2  # option log-probs and entropies
BF16_LOGIT_ATOL, BF16_LOGIT_RTOL = 5e-2, 2e-2  # last-position logits
FP32_ATOL = 1e-4  # fp32 on the device against fp32 on the CPU, and shared prefix against plain forwards
GRAD_COSINE_MIN = 0.99  # gradients of the bf16 loss against the fp32 one


def device() -> torch.device:
    """The device under test (the CPU only in the debugging mode above)."""
    return torch.device("cpu" if ON_CPU else "cuda")


def needs_real_cuda(n_devices: int = 1) -> pytest.MarkDecorator:
    """Skip unless ``n_devices`` CUDA devices exist (never satisfied by the CPU debugging mode)."""
    return pytest.mark.skipif(
        not HAS_CUDA or torch.cuda.device_count() < n_devices, reason=f"needs {n_devices} CUDA device(s)"
    )


def _mixed_tasks(env, n: int) -> list:
    """``n`` test tasks of DangerousTaxi, the three modes interleaved (prompts of different lengths)."""
    modes = [env.make_tasks("test", n, difficulty=mode) for mode in ("pickup", "dropoff", "full")]
    return [t for group in zip(*modes, strict=True) for t in group][:n]


def taxi_prompts(tokenizer, n: int = 8, reflection_words: int = 12) -> tuple[list[list[int]], list[int]]:
    """Token ids of real DangerousTaxi policy prompts (all three modes, reflections of different lengths) and the
    number of options each offers."""
    env = make_env("taxi")
    tasks = _mixed_tasks(env, n)
    prompts = []
    for i, task in enumerate(tasks):
        obs = env.reset(task=task)
        prompts.append(build_prompt(obs.text, obs.actions, "go north " * (reflection_words + 3 * i)))
    return encode_prompts(tokenizer, [p.text for p in prompts]), [p.num_options for p in prompts]


def reflection_prompts(n: int = 6) -> list[str]:
    env = make_env("taxi")
    tasks = _mixed_tasks(env, n)
    return [reflection_prompt(env.reset(task=t).text) for t in tasks]


def pickup_tasks(n: int = 8):
    """Tasks of one curriculum stage: a run of any number of steps has a valid step schedule."""
    return make_env("taxi").make_tasks("train", n, seed=0, difficulty="pickup")


def make_trainer(
    model_dir: str,
    out_dir: Path,
    *,
    policy=None,
    reflection_model: Any = "same",
    peft_config=None,
    dtype: str = "bfloat16",
    **overrides,
):
    """A ``ReflectPPOTrainer`` on the device under test: DangerousTaxi ``pickup`` tasks, bf16 unless overridden, the
    reflection model (default: the same checkpoint, frozen) and the policy loaded from ``model_dir``."""
    from reflect_trl.models import load_causal_lm, load_tokenizer
    from reflect_trl.trainers.rl_config import ReflectPPOConfig
    from reflect_trl.trainers.rl_tasks import tasks_to_dataset
    from reflect_trl.trainers.rl_trainer import ReflectPPOTrainer

    kwargs: dict[str, Any] = dict(
        output_dir=str(out_dir),
        per_device_train_batch_size=8,
        num_generations=4,
        max_steps=2,
        learning_rate=1e-3,
        use_cpu=device().type == "cpu",
        bf16=True,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        reflection_max_new_tokens=8,
        seed=0,
        data_seed=0,
        disable_tqdm=True,
    )
    kwargs.update(overrides)
    args = ReflectPPOConfig(**kwargs)
    if reflection_model == "same":
        reflection_model = load_causal_lm(model_dir, dtype=dtype, trainable=False)
    return ReflectPPOTrainer(
        model=policy if policy is not None else load_causal_lm(model_dir, dtype=dtype),
        args=args,
        train_dataset=tasks_to_dataset(pickup_tasks()),
        processing_class=load_tokenizer(model_dir),
        reflection_model=reflection_model,
        peft_config=peft_config,
    )


def logged(trainer, key: str) -> list[float]:
    """The values of ``key`` in the trainer's log history, in order."""
    return [h[key] for h in trainer.state.log_history if key in h]
