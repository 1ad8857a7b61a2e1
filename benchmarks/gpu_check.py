"""The GPU check (issue #33): the CUDA tests, real-size RL step timings and a stock TRL GRPO anchor, in one run.

On a CUDA machine, within ``--budget_s`` (default 480 s, so that two runs fit in a quarter of an hour):

1. ``pytest -m cuda tests/cuda``: bf16 against fp32 (rollout and loss forwards), 8-/4-bit policy and reflection
   players with a LoRA RL step, the reflection model on its own device, resume of a CUDA run;
2. for a GPT-2-XL-shaped and a Llama-1B-shaped model built from a config, offline (random weights, the project's own
   BPE tokenizer): RL steps of ``ReflectPPOTrainer`` at the settings of ``recipes/taxi/rl.yaml`` (LoRA, bf16, its
   episodes per rollout, group size, PPO epochs, learning rate and reflection budget) with a reflection model saved
   to a temporary folder and loaded 8-bit through ``reflect_trl.models.load_causal_lm``. Reported per optimizer step
   (mean of the timed steps; one rollout cycle of warm-up is left out): the step time split into reflection
   generation / policy scoring / loss + backward (the rest: environment and tokenization, optimizer step),
   reflection tokens per second and peak GPU memory (whole step, rollout, loss + backward);
3. the anchor, in the same run: stock ``trl.GRPOTrainer`` (transformers ``generate``, no vLLM) on the same model
   shape with the same LoRA, generating as many tokens per step (completions of the reflection budget, as many as
   the rollout writes reflections) from prompts of the same length (the reflection prompts of the same states):
   time per generated token and per optimizer step, reported as ratios ours / GRPO;
4. ``gpu_check.json`` and ``gpu_check.md`` in ``--output_dir`` (rewritten after every part, so a run stopped from
   outside leaves what it measured); the exit status is 1 when any part failed.

The episodes are DangerousTaxi ``full`` tasks in a *forgiving* variant (as ``benchmarks/rollout_throughput.py``
plays): a no-effect action wastes a step instead of ending the episode, so an untrained policy plays every episode
for ``--turns`` turns and every rollout writes the same number of reflections.

The trainer has no timing hooks of its own: this script wraps, on the trainer *instance*, ``training_step`` and
``compute_loss`` (Trainer API) and ``_prepare_inputs`` (GRPOTrainer's generation hook), the ``generate`` of the
model that writes the text (the reflection model; GRPO's policy), and ``RolloutEngine.run`` (its
``RolloutTimings``) for the duration of a measurement; a ``TrainerCallback`` times each optimizer step and stops
training at the time budget. Device work is synchronised at every boundary.

``--dry-run`` runs the same code on the CPU with tiny shapes and a few tokens, in seconds
(``tests/test_gpu_check.py``): its figures are not GPU measurements.

    make gpu-check                                                 # -> outputs/gpu_check/
    python benchmarks/gpu_check.py --output_dir DIR [--models gpt2-xl,llama-1b] [--budget_s 480]
    python benchmarks/gpu_check.py --dry-run --output_dir /tmp/gpu_check
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import gc
import json
import logging
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

# the rollout benchmark beside this script (its forgiving taxi), imported by name as when run from benchmarks/
import rollout_throughput as rt
from reflect_trl.envs import register_env
from reflect_trl.quiet import quiet_dependencies
from reflect_trl.rollout import RolloutEngine

REPO = Path(__file__).resolve().parents[1]
DEFAULT_RECIPE = REPO / "recipes" / "taxi" / "rl.yaml"
CUDA_TESTS = REPO / "tests" / "cuda"
BENCH_ENV = "taxi_forgiving_gpu_check"
GIB = 1024**3
#: Versions the project pins (pyproject.toml); another installed version is reported as a warning, not a failure.
PINNED = {
    "transformers": "5.24",
    "trl": "1.16",
    "peft": "0.21",
    "accelerate": "1.15",
    "bitsandbytes": "0.50",
    "datasets": "5.2",
}


class ForgivingTaxiEnv(rt.ForgivingTaxiEnv):
    """The forgiving DangerousTaxi of ``benchmarks/rollout_throughput.py`` on ``full`` tasks only: every episode of an
    untrained policy lasts the horizon, so every rollout writes the same number of reflections."""

    stages = ("full",)


register_env(BENCH_ENV, ForgivingTaxiEnv)


# ------------------------------------------------------------------------------------------------ settings
@dataclass(frozen=True)
class ModelSpec:
    """A model shape: its config at real size and in the dry run, and the modules LoRA adapts."""

    name: str
    arch: str  # gpt2 | llama
    real: dict[str, Any]
    tiny: dict[str, Any]
    lora_target_modules: tuple[str, ...]


MODELS: dict[str, ModelSpec] = {
    "gpt2-xl": ModelSpec(
        "gpt2-xl",
        "gpt2",
        real={"n_layer": 48, "n_embd": 1600, "n_head": 25, "n_positions": 1024},
        tiny={"n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 1024},
        lora_target_modules=(),  # the recipe's (recipes/taxi/rl.yaml: all-linear)
    ),
    "llama-1b": ModelSpec(
        "llama-1b",
        "llama",
        real={
            "hidden_size": 2048,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 8192,
            "max_position_embeddings": 2048,
            "tie_word_embeddings": True,
        },
        tiny={
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 128,
            "max_position_embeddings": 2048,
            "tie_word_embeddings": True,
        },
        lora_target_modules=("q_proj", "k_proj", "v_proj", "o_proj"),
    ),
}


@dataclass
class Settings:
    """What one measurement runs: the recipe's RL settings, with the dry run's smaller counts."""

    episodes: int  # episodes per rollout (per_device_train_batch_size)
    num_generations: int
    num_iterations: int
    turns: int
    reflection_tokens: int
    reflection_temperature: float
    learning_rate: float
    beta: float
    advantage_estimator: str
    max_grad_norm: float
    lora_r: int
    lora_alpha: int
    gpt2_lora_target_modules: str | tuple[str, ...]  # names, or peft's "all-linear" (a string)
    reflection_bits: int  # 8, 4 or 16 (not quantized)
    recipe_horizon: (
        int  # the recipe's episode horizon: the loss probe scores episodes x horizon turns at once
    )
    warmup_cycles: int
    timed_cycles: int
    seed: int
    recipe: str

    @property
    def steps(self) -> int:
        """Optimizer steps of a measurement: a cycle is one rollout and its ``num_iterations`` steps."""
        return (self.warmup_cycles + self.timed_cycles) * self.num_iterations

    @property
    def warmup_steps(self) -> int:
        return self.warmup_cycles * self.num_iterations

    @property
    def reflections_per_rollout(self) -> int:
        return self.episodes * self.turns


def _lora_targets(value: str | list[str] | None) -> str | tuple[str, ...]:
    """A recipe's ``lora_target_modules``: a string (``all-linear``, the default) as is, a list as a tuple."""
    if value is None or isinstance(value, str):
        return value or "all-linear"
    return tuple(value)


def load_settings(args: argparse.Namespace) -> Settings:
    """The recipe's RL settings (``--recipe``), the command line's overrides, and the dry run's small counts."""
    recipe = yaml.safe_load(Path(args.recipe).read_text())
    dry = args.dry_run
    episodes = 4 if dry else int(recipe.get("per_device_train_batch_size", 16))
    return Settings(
        episodes=episodes,
        num_generations=min(int(recipe.get("num_generations", 4)), 2 if dry else episodes),
        num_iterations=int(recipe.get("num_iterations", 1)),
        turns=args.turns or (2 if dry else 4),
        reflection_tokens=4 if dry else int(recipe.get("reflection_max_new_tokens", 64)),
        reflection_temperature=float(recipe.get("reflection_temperature", 1.0)),
        learning_rate=float(recipe.get("learning_rate", 1e-5)),
        beta=float(recipe.get("beta", 0.0)),
        advantage_estimator=str(recipe.get("advantage_estimator", "rloo")),
        max_grad_norm=float(recipe.get("max_grad_norm", 1.0)),
        lora_r=int(recipe.get("lora_r", 16)),
        lora_alpha=int(recipe.get("lora_alpha", 32)),
        gpt2_lora_target_modules=_lora_targets(recipe.get("lora_target_modules")),
        reflection_bits=args.reflection_bits,
        recipe_horizon=int((recipe.get("env_kwargs") or {}).get("horizon", 20)),
        warmup_cycles=args.warmup_cycles,
        timed_cycles=args.timed_cycles or (1 if dry else 2),
        seed=int(recipe.get("seed", 0)),
        recipe=str(args.recipe),
    )


# ------------------------------------------------------------------------------------------------ clocks
class Budget:
    """The run's wall-clock budget: progress lines with the elapsed time, and the deadline every part checks."""

    def __init__(self, seconds: float) -> None:
        self.start = time.monotonic()
        self.seconds = seconds

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    @property
    def remaining(self) -> float:
        return self.seconds - self.elapsed

    def log(self, message: str) -> None:
        print(f"[gpu-check +{self.elapsed:6.1f}s] {message}", file=sys.stderr, flush=True)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class MemoryMeter:
    """Peak allocated GPU memory per phase: each ``checkpoint(phase)`` files the peak since the previous one under
    ``phase`` (and the overall peak) and resets the counter. No-op off CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.peaks: dict[str, int] = {}
        self.overall = 0
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)

    def checkpoint(self, phase: str) -> None:
        if not self.cuda:
            return
        peak = torch.cuda.max_memory_allocated(self.device)
        self.peaks[phase] = max(self.peaks.get(phase, 0), peak)
        self.overall = max(self.overall, peak)
        torch.cuda.reset_peak_memory_stats(self.device)

    def report(self) -> dict[str, float | None]:
        if not self.cuda:
            return {"peak_gib": None}
        out: dict[str, float | None] = {"peak_gib": self.overall / GIB}
        out.update({f"peak_{k}_gib": v / GIB for k, v in self.peaks.items()})
        out["reserved_gib"] = torch.cuda.max_memory_reserved(self.device) / GIB
        return out


# ------------------------------------------------------------------------------------------------ instrumentation
@dataclass
class StepRecord:
    """What one optimizer step spent, as seen from outside the trainer."""

    step: int = 0
    step_s: float = 0.0
    training_step_s: float = 0.0
    prepare_s: float = 0.0  # _prepare_inputs: the rollout / generation and everything GRPO buffers with it
    loss_forward_s: float = 0.0  # compute_loss alone (its backward is in training_step_s - prepare_s)
    generate_s: float = 0.0  # the text model's generate calls (reflections; GRPO's completions)
    generate_calls: int = 0
    generated_tokens: int = 0  # up to and including each row's first stop token
    generated_positions: int = 0  # rows x new columns (what the decode loop computed)
    prompt_tokens: int = 0  # unpadded prompt tokens of the generate calls
    prompt_rows: int = 0
    rollout_s: float = 0.0  # RolloutEngine.run (ours)
    rollout: dict[str, float] = field(default_factory=dict)  # RolloutTimings deltas (ours)
    #: shapes of the loss micro-batch's 2-D tensors
    loss_batch: dict[str, list[int]] = field(default_factory=dict)


def _first_tensor(args: tuple, kwargs: dict, name: str) -> torch.Tensor | None:
    value = kwargs.get(name)
    if value is None and args and isinstance(args[0], torch.Tensor):
        value = args[0]
    return value if isinstance(value, torch.Tensor) else None


def _stop_ids(model, kwargs: dict) -> list[int]:
    ids = kwargs.get("eos_token_id")
    if ids is None:
        config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
        ids = getattr(config, "eos_token_id", None)
    if ids is None:
        return []
    return [int(i) for i in (ids if isinstance(ids, list | tuple) else [ids])]


class Recorder:
    """Times every optimizer step of one ``trainer.train()`` from outside: instance wrappers (removed by
    :meth:`close`), a class-level wrapper of ``RolloutEngine.run`` and a callback (:meth:`callback`)."""

    def __init__(self, trainer, text_model, device: torch.device, budget: Budget, label: str) -> None:
        self.trainer = trainer
        self.device = device
        self.budget = budget
        self.label = label
        self.memory = MemoryMeter(device)
        self.steps: list[StepRecord] = []
        self.current = StepRecord()
        self.stopped_by_budget = False
        self.loss_inputs: dict | None = (
            None  # the last micro-batch compute_loss was given (for the loss probe)
        )
        self._restore: list[Callable[[], None]] = []
        self._wrap(trainer, "training_step", self._timed_training_step)
        self._wrap(trainer, "compute_loss", self._timed_compute_loss)
        self._wrap(trainer, "_prepare_inputs", self._timed_prepare_inputs)
        self._wrap(text_model, "generate", self._timed_generate)
        original_run = RolloutEngine.run
        RolloutEngine.run = self._timed_rollout(original_run)
        self._restore.append(lambda: setattr(RolloutEngine, "run", original_run))

    # -- wrappers
    def _wrap(self, obj, name: str, make: Callable[[Callable], Callable]) -> None:
        original = getattr(obj, name)
        setattr(obj, name, functools.wraps(original)(make(original)))
        self._restore.append(lambda: delattr(obj, name))

    def _timed_training_step(self, original: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            synchronize(self.device)
            self.memory.checkpoint("other")
            start = time.perf_counter()
            out = original(*args, **kwargs)
            synchronize(self.device)
            self.current.training_step_s += time.perf_counter() - start
            self.memory.checkpoint("loss_backward")
            return out

        return wrapper

    def _timed_prepare_inputs(self, original: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            synchronize(self.device)
            start = time.perf_counter()
            out = original(*args, **kwargs)
            synchronize(self.device)
            self.current.prepare_s += time.perf_counter() - start
            self.memory.checkpoint("generation")
            return out

        return wrapper

    def _timed_compute_loss(self, original: Callable) -> Callable:
        def wrapper(model, inputs, *args, **kwargs):
            synchronize(self.device)
            start = time.perf_counter()
            out = original(model, inputs, *args, **kwargs)
            synchronize(self.device)
            self.current.loss_forward_s += time.perf_counter() - start
            self.loss_inputs = inputs if isinstance(inputs, dict) else None
            if not self.current.loss_batch and isinstance(inputs, dict):
                self.current.loss_batch = {
                    k: list(v.shape)
                    for k, v in inputs.items()
                    if isinstance(v, torch.Tensor) and v.dim() == 2
                }
            return out

        return wrapper

    def _timed_generate(self, original: Callable) -> Callable:
        model = getattr(original, "__self__", None)

        def wrapper(*args, **kwargs):
            synchronize(self.device)
            start = time.perf_counter()
            out = original(*args, **kwargs)
            synchronize(self.device)
            record = self.current
            record.generate_s += time.perf_counter() - start
            record.generate_calls += 1
            input_ids = _first_tensor(args, kwargs, "input_ids")
            sequences = out if isinstance(out, torch.Tensor) else getattr(out, "sequences", None)
            if input_ids is not None and sequences is not None:
                new = sequences[:, input_ids.shape[1] :]
                stops = _stop_ids(model, kwargs)
                width = new.shape[1]
                if stops and width:
                    is_stop = torch.isin(new, torch.as_tensor(stops, device=new.device))
                    lengths = torch.where(is_stop.any(1), is_stop.int().argmax(1) + 1, width)
                else:
                    lengths = torch.full((new.shape[0],), width)
                record.generated_tokens += int(lengths.sum())
                record.generated_positions += int(new.numel())
                mask = kwargs.get("attention_mask")
                record.prompt_tokens += int(mask.sum()) if mask is not None else int(input_ids.numel())
                record.prompt_rows += int(input_ids.shape[0])
            return out

        return wrapper

    def _timed_rollout(self, original: Callable) -> Callable:
        recorder = self

        def run(engine, *args, **kwargs):
            before = engine.timings.as_dict()
            synchronize(recorder.device)
            start = time.perf_counter()
            out = original(engine, *args, **kwargs)
            synchronize(recorder.device)
            recorder.current.rollout_s += time.perf_counter() - start
            for key, value in engine.timings.as_dict().items():
                recorder.current.rollout[key] = recorder.current.rollout.get(key, 0.0) + value - before[key]
            return out

        return run

    # -- the callback
    def attach(self) -> None:
        """Add the step clock to the trainer, and take its printed log lines off (one progress line per step)."""
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        self.trainer.remove_callback(PrinterCallback)
        self.trainer.remove_callback(ProgressCallback)
        self.trainer.add_callback(self.callback())

    def callback(self):
        """A ``TrainerCallback`` timing each optimizer step and stopping the run at the budget."""
        from transformers import TrainerCallback

        recorder = self

        class StepClock(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                synchronize(recorder.device)
                recorder.current = StepRecord()
                recorder._step_start = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                synchronize(recorder.device)
                record = recorder.current
                record.step = state.global_step
                record.step_s = time.perf_counter() - recorder._step_start
                recorder.memory.checkpoint("optimizer")
                recorder.steps.append(record)
                recorder.budget.log(
                    f"{recorder.label} step {state.global_step}/{state.max_steps}: {record.step_s:.2f} s "
                    f"(generate {record.generate_s:.2f} s, loss + backward "
                    f"{record.training_step_s - record.prepare_s:.2f} s)"
                )
                if recorder.budget.remaining <= 0:
                    recorder.stopped_by_budget = True
                    control.should_training_stop = True

        return StepClock()

    def close(self) -> None:
        while self._restore:
            self._restore.pop()()


def _total(records: list[StepRecord], key: str) -> float:
    return float(sum(getattr(r, key) for r in records))


def _rollout_total(records: list[StepRecord], key: str) -> float:
    return float(sum(r.rollout.get(key, 0.0) for r in records))


def summarize_steps(records: list[StepRecord], warmup_steps: int, reflect: bool) -> dict[str, Any]:
    """Means per optimizer step over the timed steps (after ``warmup_steps``), split into phases that add up to the
    step time; generated tokens per second over the timed generate calls."""
    timed = records[warmup_steps:]
    if not timed:
        raise RuntimeError(f"no timed step: {len(records)} step(s) ran, {warmup_steps} of them warm-up")
    n = len(timed)
    step = _total(timed, "step_s") / n
    training_step = _total(timed, "training_step_s") / n
    prepare = _total(timed, "prepare_s") / n
    generate = _total(timed, "generate_s")
    tokens = _total(timed, "generated_tokens")
    out: dict[str, Any] = {
        "timed_steps": n,
        "warmup_steps": warmup_steps,
        "step_s": step,
        "loss_backward_s": training_step - prepare,
        "loss_forward_s": _total(timed, "loss_forward_s") / n,
        "optimizer_other_s": step - training_step,
        "generated_tokens_per_step": tokens / n,
        "generated_positions_per_step": _total(timed, "generated_positions") / n,
        "generate_calls_per_step": _total(timed, "generate_calls") / n,
        "generate_s_per_step": generate / n,
        "prompt_tokens_mean": _total(timed, "prompt_tokens") / max(_total(timed, "prompt_rows"), 1.0),
        "generated_rows_per_step": _total(timed, "prompt_rows") / n,
        "seconds_per_generated_token": generate / tokens if tokens else math.nan,
        "generated_tokens_per_s": tokens / generate if generate else math.nan,
        "loss_batch": next((r.loss_batch for r in timed if r.loss_batch), {}),
    }
    if reflect:
        rollout = _total(timed, "rollout_s") / n
        reflection = _rollout_total(timed, "reflection_s") / n
        policy = _rollout_total(timed, "policy_s") / n
        env = (_rollout_total(timed, "env_s") + _rollout_total(timed, "tokenize_s")) / n
        out.update(
            {
                "reflection_generation_s": reflection,
                # the rollout's policy forwards + what _prepare_inputs does besides the rollout (old / reference
                # log-prob forwards of stored turns, advantages, batch assembly)
                "policy_scoring_s": policy + (prepare - rollout),
                "policy_rollout_forward_s": policy,
                "scoring_and_batch_s": prepare - rollout,
                # environment steps, prompt building and tokenization, the engine's own bookkeeping
                "env_tokenize_s": rollout - reflection - policy,
                "env_and_tokenize_only_s": env,
                "rollout_s": rollout,
                "rollout_reflection_tokens_per_step": _rollout_total(timed, "reflection_tokens") / n,
                "env_steps_per_step": _rollout_total(timed, "env_steps") / n,
            }
        )
    else:
        out.update({"generation_s": generate / n, "prepare_other_s": prepare - generate / n})
    return out


# ------------------------------------------------------------------------------------------------ models
def model_config(spec: ModelSpec, tokenizer, dry_run: bool):
    """The model's config (tiny shapes in the dry run) with the project tokenizer's vocabulary and special ids."""
    from transformers import GPT2Config, LlamaConfig

    common = {
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    shape = spec.tiny if dry_run else spec.real
    if spec.arch == "gpt2":
        return GPT2Config(**shape, **common)
    return LlamaConfig(**shape, **common)


def build_model(config, seed: int, device: torch.device, dtype: torch.dtype, tokenizer):
    """A randomly initialised causal LM, created directly on ``device`` in ``dtype`` (offline, no weights)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def load_reflection(config, seed: int, device: torch.device, tokenizer, bits: int, folder: Path):
    """The frozen reflection model as the real path loads it: built, saved to ``folder`` with the tokenizer, and
    loaded back with ``reflect_trl.models.load_causal_lm`` (8-/4-bit through bitsandbytes unless ``bits`` is 16)."""
    from reflect_trl.models import load_causal_lm, quantization_config

    model = build_model(config, seed, device, torch.bfloat16, tokenizer)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    _free(device)
    quantization = quantization_config(load_in_8bit=bits == 8, load_in_4bit=bits == 4)
    loaded = load_causal_lm(str(folder), dtype="bfloat16", trainable=False, quantization=quantization)
    if quantization is None:
        loaded.to(device)
    return loaded, params


def lora_config(settings: Settings, spec: ModelSpec):
    from peft import LoraConfig

    targets = spec.lora_target_modules or settings.gpt2_lora_target_modules
    return LoraConfig(
        r=settings.lora_r,
        lora_alpha=settings.lora_alpha,
        lora_dropout=0.05,
        target_modules=targets if isinstance(targets, str) else list(targets),
        fan_in_fan_out=spec.arch == "gpt2",  # GPT-2's Conv1D layers store their weights transposed
        task_type="CAUSAL_LM",
    )


def _free(device: torch.device) -> None:
    """Give the memory of dropped models back to the device (a no-op on the CPU, where it only costs time)."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------ measurements
@dataclass
class Context:
    """What every part of one run shares."""

    settings: Settings
    device: torch.device
    dry_run: bool
    budget: Budget
    tokenizer_dir: str
    scratch: Path


def measure_reflect(ctx: Context, spec: ModelSpec) -> dict[str, Any]:
    """RL steps of ``ReflectPPOTrainer`` on the model shape: LoRA policy in bf16, quantized reflection model."""
    from reflect_trl.models import load_tokenizer
    from reflect_trl.trainers.rl_config import ReflectPPOConfig
    from reflect_trl.trainers.rl_tasks import build_train_tasks, tasks_to_dataset
    from reflect_trl.trainers.rl_trainer import ReflectPPOTrainer

    s, device = ctx.settings, ctx.device
    tokenizer = load_tokenizer(ctx.tokenizer_dir)
    config = model_config(spec, tokenizer, ctx.dry_run)
    ctx.budget.log(f"{spec.name}: building the policy and the {s.reflection_bits}-bit reflection model")
    folder = ctx.scratch / f"{spec.name}-reflection"
    reflection, reflection_params = load_reflection(
        config, s.seed + 1, device, load_tokenizer(ctx.tokenizer_dir), s.reflection_bits, folder
    )
    policy = build_model(config, s.seed, device, torch.bfloat16, tokenizer)
    policy_params = sum(p.numel() for p in policy.parameters())
    args = ReflectPPOConfig(
        output_dir=str(ctx.scratch / f"{spec.name}-rl"),
        env_name=BENCH_ENV,
        env_kwargs={"horizon": s.turns},
        advantage_estimator=s.advantage_estimator,
        max_steps=s.steps,
        per_device_train_batch_size=s.episodes,
        num_generations=s.num_generations,
        num_iterations=s.num_iterations,
        learning_rate=s.learning_rate,
        num_train_tasks=4 * s.episodes,
        reflection_max_new_tokens=s.reflection_tokens,
        reflection_temperature=s.reflection_temperature,
        # every reflection generated, none from the greedy memo: the check times generation (and the GRPO anchor
        # generates as many completions as the rollout wrote reflections)
        reflection_cache_size=0,
        use_cpu=ctx.dry_run,
        bf16=True,
        report_to="none",
        save_strategy="no",
        seed=s.seed,
        logging_steps=1,
        beta=s.beta,
        max_grad_norm=s.max_grad_norm,
        disable_tqdm=True,
    )
    trainer = ReflectPPOTrainer(
        model=policy,
        args=args,
        processing_class=tokenizer,
        train_dataset=tasks_to_dataset(build_train_tasks(args)),
        reflection_model=reflection,
        reflection_tokenizer=load_tokenizer(ctx.tokenizer_dir),
        peft_config=lora_config(s, spec),
    )
    recorder = Recorder(trainer, reflection, device, ctx.budget, f"{spec.name} reflect-rl")
    recorder.attach()
    ctx.budget.log(f"{spec.name}: {s.steps} ReflectPPOTrainer steps ({s.warmup_steps} of them warm-up)")
    try:
        trainer.train()
    finally:
        recorder.close()
    rows = s.episodes * s.recipe_horizon
    ctx.budget.log(f"{spec.name}: loss forward + backward on {rows} turns at once (the recipe's horizon)")
    probe = probe_loss(trainer, recorder.loss_inputs, rows, device)
    result = {
        "trainer": "ReflectPPOTrainer",
        "policy_params": policy_params,
        "trainable_params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
        "reflection_params": reflection_params,
        "reflection_quantization": f"{s.reflection_bits}-bit" if s.reflection_bits < 16 else "bf16",
        "reflection_device": str(next(reflection.parameters()).device),
        "activation_checkpointing": bool(trainer.args.activation_checkpointing),
        "steps_run": len(recorder.steps),
        "stopped_by_budget": recorder.stopped_by_budget,
        "timing": summarize_steps(recorder.steps, s.warmup_steps, reflect=True),
        "memory": recorder.memory.report(),
        "loss_probe": probe,
        "raw_steps": [asdict(r) for r in recorder.steps],
    }
    del trainer, policy, reflection, recorder
    _free(device)
    if result["stopped_by_budget"]:
        raise BudgetExceeded(
            f"{spec.name}: stopped at the time budget after {result['steps_run']} steps", result
        )
    return result


def probe_loss(trainer, inputs: dict | None, rows: int, device: torch.device) -> dict[str, Any]:
    """One ``compute_loss`` forward + backward on a micro-batch of ``rows`` turns (the trainer scores a whole
    micro-batch at once): a timed step's micro-batch, its rows repeated. Every tensor whose first dimension is the
    batch's rows is repeated; the rest (the window counts) is kept, which changes the loss's scale, not its cost."""
    if not inputs:
        raise RuntimeError("no loss micro-batch was recorded")
    n = next(v.shape[0] for v in inputs.values() if isinstance(v, torch.Tensor) and v.dim() >= 1)
    repeat = -(-rows // n)
    big = {
        k: torch.cat([v] * repeat)[:rows]
        if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == n
        else v
        for k, v in inputs.items()
    }
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    meter = MemoryMeter(device)
    synchronize(device)
    start = time.perf_counter()
    loss = trainer.compute_loss(model, big)
    trainer.accelerator.backward(loss)
    synchronize(device)
    seconds = time.perf_counter() - start
    meter.checkpoint("probe")
    model.zero_grad(set_to_none=True)
    width = max((v.shape[1] for v in big.values() if isinstance(v, torch.Tensor) and v.dim() == 2), default=0)
    return {"rows": rows, "width": width, "seconds": seconds, "peak_gib": meter.report()["peak_gib"]}


def length_parity_reward(completions: list, **_: Any) -> list[float]:
    """The anchor's trivial reward (1 for an even number of characters): cheap, and not constant."""
    return [float(len(str(c)) % 2 == 0) for c in completions]


def anchor_prompts(n: int, seed: int) -> list[str]:
    """Reflection prompts of the forgiving DangerousTaxi's start states: the prompts the reflection model reads."""
    from reflect_trl.envs import make_env
    from reflect_trl.prompts import reflection_prompt

    env = make_env(BENCH_ENV)
    return [reflection_prompt(env.reset(task=t).text) for t in env.make_tasks("train", n, seed=seed)]


def measure_grpo(ctx: Context, spec: ModelSpec, reflections_per_rollout: float | None) -> dict[str, Any]:
    """Stock ``trl.GRPOTrainer`` (transformers generate, no vLLM) on the same model shape and LoRA, with as many
    completions of the reflection budget per generation as a rollout wrote reflections (``reflections_per_rollout``,
    measured; default: episodes x turns), rounded to a multiple of the group size."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from reflect_trl.models import load_tokenizer

    s, device = ctx.settings, ctx.device
    tokenizer = load_tokenizer(ctx.tokenizer_dir)
    config = model_config(spec, tokenizer, ctx.dry_run)
    wanted = reflections_per_rollout or s.reflections_per_rollout
    completions = max(round(wanted / s.num_generations), 1) * s.num_generations
    policy = build_model(config, s.seed, device, torch.bfloat16, tokenizer)
    args = GRPOConfig(
        output_dir=str(ctx.scratch / f"{spec.name}-grpo"),
        per_device_train_batch_size=completions,
        num_generations=s.num_generations,
        num_iterations=s.num_iterations,
        max_completion_length=s.reflection_tokens,
        temperature=s.reflection_temperature if s.reflection_temperature > 0 else 1.0,
        learning_rate=s.learning_rate,
        beta=s.beta,
        max_grad_norm=s.max_grad_norm,
        max_steps=s.steps,
        use_vllm=False,
        use_cpu=ctx.dry_run,
        bf16=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=s.seed,
        disable_tqdm=True,
    )
    prompts = anchor_prompts(2 * completions, s.seed)
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=[length_parity_reward],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
        peft_config=lora_config(s, spec),
    )
    text_model = trainer.accelerator.unwrap_model(trainer.model)
    recorder = Recorder(trainer, text_model, device, ctx.budget, f"{spec.name} trl-grpo")
    recorder.attach()
    ctx.budget.log(f"{spec.name}: {s.steps} GRPOTrainer steps, {completions} completions per generation")
    try:
        trainer.train()
    finally:
        recorder.close()
    result = {
        "trainer": "trl.GRPOTrainer",
        "generation": "transformers generate (use_vllm=False), bf16 policy with its LoRA adapter",
        "completions_per_generation": completions,
        "max_completion_length": s.reflection_tokens,
        "activation_checkpointing": bool(trainer.args.gradient_checkpointing),
        "steps_run": len(recorder.steps),
        "stopped_by_budget": recorder.stopped_by_budget,
        "timing": summarize_steps(recorder.steps, s.warmup_steps, reflect=False),
        "memory": recorder.memory.report(),
        "raw_steps": [asdict(r) for r in recorder.steps],
    }
    del trainer, policy, text_model, recorder
    _free(device)
    if result["stopped_by_budget"]:
        raise BudgetExceeded(
            f"{spec.name}: GRPO stopped at the time budget after {result['steps_run']} steps", result
        )
    return result


def ratios(ours: dict[str, Any], grpo: dict[str, Any]) -> dict[str, float]:
    """Ours over GRPO: time per optimizer step and per generated token (both timed over the same number of steps)."""
    a, b = ours["timing"], grpo["timing"]
    return {
        "step_time_ours_over_grpo": a["step_s"] / b["step_s"],
        "time_per_generated_token_ours_over_grpo": a["seconds_per_generated_token"]
        / b["seconds_per_generated_token"],
        "generated_tokens_per_step_ours_over_grpo": a["generated_tokens_per_step"]
        / b["generated_tokens_per_step"],
        "prompt_tokens_ours_over_grpo": a["prompt_tokens_mean"] / b["prompt_tokens_mean"],
    }


class BudgetExceeded(RuntimeError):
    """A measurement stopped at the time budget (its partial result travels with it)."""

    def __init__(self, message: str, result: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.result = result


# ------------------------------------------------------------------------------------------------ CUDA tests
def run_cuda_tests(output_dir: Path, timeout_s: float, budget: Budget, on_cuda: bool) -> dict[str, Any]:
    """``pytest -m cuda tests/cuda`` in a subprocess (log and JUnit XML in ``output_dir``); on a CUDA machine a
    run in which no test passed is a failure."""
    xml = output_dir / "cuda_tests.xml"
    log = output_dir / "cuda_tests.log"
    command = [sys.executable, "-m", "pytest", "-m", "cuda", str(CUDA_TESTS), "-q", "-p", "no:cacheprovider"]
    command += [f"--junitxml={xml}"]
    budget.log(f"CUDA tests: {' '.join(command[1:])} (timeout {timeout_s:.0f} s)")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    start = time.monotonic()
    try:
        proc = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, timeout=max(timeout_s, 1.0)
        )
    except subprocess.TimeoutExpired as err:
        log.write_text(_text(err.stdout) + _text(err.stderr))
        raise RuntimeError(f"the CUDA tests did not finish within {timeout_s:.0f} s (log: {log})") from None
    log.write_text(proc.stdout + proc.stderr)
    result: dict[str, Any] = {"command": " ".join(["python", *command[1:]]), "exit_status": proc.returncode}
    result.update(parse_junit(xml))
    result["seconds"] = time.monotonic() - start
    tail = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
    budget.log(f"CUDA tests: {tail[0] if tail else 'no output'}")
    if proc.returncode not in (0, 5):  # 5: nothing collected
        raise PartFailed(f"pytest -m cuda exited with status {proc.returncode} (log: {log})", result)
    if on_cuda and result.get("passed", 0) == 0:
        raise PartFailed("no CUDA test passed on a CUDA machine", result)
    return result


def _text(value: str | bytes | None) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")


def parse_junit(path: Path) -> dict[str, Any]:
    """Counts (passed / failed / errors / skipped) and the failed tests' names and first message lines."""
    if not path.is_file():
        return {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []}
    root = ET.parse(path).getroot()
    cases = list(root.iter("testcase"))
    counts = {"failed": 0, "errors": 0, "skipped": 0}
    failures = []
    for case in cases:
        for tag, key in (("failure", "failed"), ("error", "errors"), ("skipped", "skipped")):
            node = case.find(tag)
            if node is not None:
                counts[key] += 1
                if key != "skipped":
                    message = (node.get("message") or node.text or "").strip().splitlines()
                    failures.append(
                        f"{case.get('classname')}::{case.get('name')}: {message[0] if message else ''}"
                    )
                break
    passed = len(cases) - sum(counts.values())
    return {"passed": passed, **counts, "failures": failures}


class PartFailed(RuntimeError):
    """A part ran but its check failed (its result travels with it)."""

    def __init__(self, message: str, result: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.result = result


# ------------------------------------------------------------------------------------------------ report
def machine_info(device: torch.device) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            {
                "gpu": props.name,
                "gpu_count": torch.cuda.device_count(),
                "gpu_memory_gib": props.total_memory / GIB,
                "compute_capability": f"{props.major}.{props.minor}",
                "bf16_supported": torch.cuda.is_bf16_supported(),
            }
        )
    packages, warnings_ = {}, []
    for name in ("transformers", "trl", "peft", "accelerate", "bitsandbytes", "datasets", "reflect-trl"):
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            packages[name] = None
        pin = PINNED.get(name)
        if pin and packages[name] and not packages[name].startswith(pin):
            warnings_.append(f"{name} {packages[name]} is installed; the project pins {pin}.*")
    info["packages"] = packages
    info["warnings"] = warnings_
    return info


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _params(n: int | None) -> str:
    return "–" if not n else f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def _rows_per_call(timing: dict[str, Any]) -> float:
    calls = timing.get("generate_calls_per_step") or 0.0
    return timing.get("generated_rows_per_step", 0.0) / calls if calls else math.nan


def markdown_report(record: dict[str, Any]) -> str:
    """The tables of one run (``gpu_check.md``)."""
    m, s = record["machine"], record["settings"]
    where = m.get("gpu") or f"CPU ({m['cpu_count']} cores)"
    lines = [f"# GPU check — {m['date']} — {where}", ""]
    if record["dry_run"]:
        lines += [
            "**Dry run on the CPU with tiny shapes (`--dry-run`): no figure here is a GPU measurement.**",
            "",
        ]
    packages = ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v)
    lines += [
        f"torch {m['torch']} (CUDA {m['torch_cuda']}), {packages}; {record['elapsed_s']:.0f} s of a "
        f"{record['budget_s']:.0f} s budget; exit status {record['exit_status']}.",
        "",
        f"Settings ({Path(s['recipe']).name}): {s['episodes']} episodes of {s['turns']} turns per rollout "
        f"(forgiving DangerousTaxi `full`), {s['num_generations']} per task, {s['num_iterations']} PPO epochs per "
        f"rollout, reflection budget {s['reflection_tokens']} tokens at temperature {s['reflection_temperature']}, "
        f"LoRA r={s['lora_r']} alpha={s['lora_alpha']}, bf16 policy, {s['reflection_bits']}-bit reflection model; "
        f"{s['warmup_cycles']} rollout cycle(s) of warm-up left out, {s['timed_cycles']} timed "
        f"({s['timed_cycles'] * s['num_iterations']} optimizer steps).",
        "",
    ]
    tests = record["parts"].get("cuda_tests")
    if tests:
        r = tests.get("result") or {}
        lines += ["## CUDA tests (`pytest -m cuda tests/cuda`)", ""]
        if r:
            lines.append(
                f"{r.get('passed', 0)} passed, {r.get('failed', 0)} failed, {r.get('errors', 0)} errors, "
                f"{r.get('skipped', 0)} skipped ({_fmt(r.get('seconds'), 0)} s)."
            )
        lines += [f"- {f}" for f in r.get("failures", [])]
        if tests["status"] != "ok":
            lines.append(f"- **{tests['status']}**: {tests.get('error', '')}")
        lines.append("")
    lines += [
        "## Reflect-RL step (`ReflectPPOTrainer`), seconds per optimizer step",
        "",
        "| model | params (policy / reflection) | RL step | reflection generation | policy scoring | loss + backward "
        "| env + tokenize | optimizer + other | reflection tok/s | peak GPU memory (GiB): step / rollout / loss+bwd |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    anchors = [
        "",
        "## Anchor: stock `trl.GRPOTrainer` on the same model shape (HF generate, no vLLM)",
        "",
        "| model | generated tokens / step (ours / GRPO) | rows per generate (ours / GRPO) "
        "| prompt tokens (ours / GRPO) | GRPO step (s) | GRPO ms / generated token | ours ms / reflection token "
        "| **per token: ours / GRPO** | **per step: ours / GRPO** | GRPO peak GPU memory (GiB) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    probes: list[str] = []
    for name in record["models"]:
        ours = (record["parts"].get(f"reflect:{name}") or {}).get("result") or {}
        grpo = (record["parts"].get(f"grpo:{name}") or {}).get("result") or {}
        t, mem = ours.get("timing") or {}, ours.get("memory") or {}
        if t:
            lines.append(
                f"| {name} | {_params(ours.get('policy_params'))} / {_params(ours.get('reflection_params'))} "
                f"| {_fmt(t['step_s'])} | {_fmt(t['reflection_generation_s'])} | {_fmt(t['policy_scoring_s'])} "
                f"| {_fmt(t['loss_backward_s'])} | {_fmt(t['env_tokenize_s'])} | {_fmt(t['optimizer_other_s'])} "
                f"| {_fmt(t['generated_tokens_per_s'], 0)} | {_fmt(mem.get('peak_gib'), 1)} / "
                f"{_fmt(mem.get('peak_generation_gib'), 1)} / {_fmt(mem.get('peak_loss_backward_gib'), 1)} |"
            )
        else:
            lines.append(f"| {name} | failed: see below |" + " |" * 8)
        probe = ours.get("loss_probe")
        if probe:
            probes.append(
                f"- {name}: {probe['rows']} turns x {probe['width']} tokens: {_fmt(probe['seconds'])} s, "
                f"peak GPU memory {_fmt(probe['peak_gib'], 1)} GiB"
            )
        g, r = grpo.get("timing") or {}, record["ratios"].get(name) or {}
        if g and t:
            anchors.append(
                f"| {name} | {_fmt(t['generated_tokens_per_step'], 0)} / {_fmt(g['generated_tokens_per_step'], 0)} "
                f"| {_fmt(_rows_per_call(t), 0)} / {_fmt(_rows_per_call(g), 0)} "
                f"| {_fmt(t['prompt_tokens_mean'], 0)} / {_fmt(g['prompt_tokens_mean'], 0)} | {_fmt(g['step_s'])} "
                f"| {_fmt(1000 * g['seconds_per_generated_token'], 3)} "
                f"| {_fmt(1000 * t['seconds_per_generated_token'], 3)} "
                f"| **{_fmt(r.get('time_per_generated_token_ours_over_grpo'))}** "
                f"| **{_fmt(r.get('step_time_ours_over_grpo'))}** "
                f"| {_fmt((grpo.get('memory') or {}).get('peak_gib'), 1)} |"
            )
        else:
            anchors.append(f"| {name} | failed: see below |" + " |" * 8)
    if probes:
        lines += [
            "",
            f"Loss forward + backward of one micro-batch at the recipe's horizon ({s['episodes']} episodes x "
            f"{s['recipe_horizon']} turns scored at once, one call of `compute_loss`):",
            "",
            *probes,
        ]
    lines += anchors
    writer = f"{s['reflection_bits']}-bit" if s["reflection_bits"] < 16 else "bf16"
    lines += [
        "",
        "Policy scoring = the rollout's policy forwards + what GRPO's `_prepare_inputs` does besides the rollout "
        "(old / reference log-prob forwards of stored turns, advantages, batch assembly); loss + backward = "
        "`training_step` minus `_prepare_inputs`; with `num_iterations` 2 every other step reuses its rollout, so a "
        "step's figures are means over rollout and reuse steps. Per token = seconds in the text model's `generate` "
        f"per generated token (up to each row's stop): ours writes with the {writer} reflection model, one "
        "`generate` of the live episodes per turn; GRPO with its bf16 LoRA policy, one `generate` of all "
        "completions; per step = mean optimizer step time.",
    ]
    failed = [(k, v) for k, v in record["parts"].items() if v["status"] != "ok"]
    if failed:
        lines += ["", "## Failures", ""]
        lines += [f"- `{k}` ({v['status']}): {v.get('error', '')}" for k, v in failed]
    return "\n".join(lines) + "\n"


def write_report(record: dict[str, Any], output_dir: Path) -> None:
    record["elapsed_s"] = record["budget"].elapsed if isinstance(record.get("budget"), Budget) else 0.0
    clean = {k: v for k, v in record.items() if k != "budget"}
    clean["exit_status"] = 0 if all(p["status"] == "ok" for p in record["parts"].values()) else 1
    record["exit_status"] = clean["exit_status"]
    (output_dir / "gpu_check.json").write_text(json.dumps(clean, indent=2, default=str) + "\n")
    (output_dir / "gpu_check.md").write_text(markdown_report(clean))


# ------------------------------------------------------------------------------------------------ main
@contextlib.contextmanager
def part(
    record: dict[str, Any], name: str, budget: Budget, output_dir: Path, device: torch.device
) -> Iterator[dict]:
    """Run one part of the check: its status, error and seconds go into ``record["parts"][name]``; a failure is
    recorded (with the partial result when there is one) and the run goes on; the report is rewritten after it."""
    entry: dict[str, Any] = {"status": "running"}
    record["parts"][name] = entry
    start = time.monotonic()
    try:
        yield entry
        entry["status"] = "ok"
    except Exception as err:  # every failure is a finding: recorded, and the exit status becomes 1
        entry["status"] = "budget" if isinstance(err, BudgetExceeded) else "failed"
        entry["error"] = f"{type(err).__name__}: {err}"
        entry["traceback"] = traceback.format_exc(limit=12)
        if getattr(err, "result", None) is not None:
            entry["result"] = err.result
        budget.log(f"{name}: {entry['status'].upper()}: {entry['error'].splitlines()[0]}")
    finally:
        _free(device)  # after the except clause has dropped the traceback (and the frames holding the models)
        entry["seconds"] = time.monotonic() - start
        write_report(record, output_dir)


def skip_part(record: dict[str, Any], name: str, why: str) -> None:
    record["parts"][name] = {"status": "budget", "error": why, "seconds": 0.0}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", default="outputs/gpu_check", help="where gpu_check.json / .md go")
    parser.add_argument(
        "--dry-run", "--dry_run", dest="dry_run", action="store_true", help="CPU, tiny shapes"
    )
    parser.add_argument("--models", default="gpt2-xl,llama-1b", help=f"comma-separated, of {sorted(MODELS)}")
    parser.add_argument(
        "--recipe", default=str(DEFAULT_RECIPE), help="the RL recipe whose settings are measured"
    )
    parser.add_argument(
        "--budget_s", type=float, default=None, help="wall-clock budget (default 480; dry run 300)"
    )
    parser.add_argument(
        "--tests_timeout_s", type=float, default=210.0, help="at most this long for pytest -m cuda"
    )
    parser.add_argument("--skip_cuda_tests", action="store_true", help="leave out pytest -m cuda")
    parser.add_argument("--turns", type=int, default=None, help="turns per episode (default 4; dry run 2)")
    parser.add_argument("--warmup_cycles", type=int, default=1, help="rollout cycles left out of the timing")
    parser.add_argument(
        "--timed_cycles", type=int, default=None, help="timed rollout cycles (default 2; dry 1)"
    )
    parser.add_argument(
        "--reflection_bits", type=int, choices=(4, 8, 16), default=8, help="16: not quantized"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (dry run default 1: tiny models gain nothing)",
    )
    parser.add_argument(
        "--tokenizer_dir", default=None, help="a folder of the project's tokenizer (default: built)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the check; returns the exit status (0: every part passed)."""
    args = build_parser().parse_args(argv)
    if args.threads is None and args.dry_run:
        args.threads = 1
    quiet_dependencies()
    # bitsandbytes' int8 matmul computes in float16 and says so at every call
    logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the shard writing / weight loading bars of every save and load
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("WANDB_MODE", "disabled")
    budget = Budget(args.budget_s if args.budget_s is not None else (300.0 if args.dry_run else 480.0))
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        print(
            f"gpu_check: unknown model(s) {unknown or names}; choose from {sorted(MODELS)}", file=sys.stderr
        )
        return 2
    if not args.dry_run and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device; run on a GPU machine, or use --dry-run (CPU, tiny shapes)",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cpu" if args.dry_run else "cuda")
    settings = load_settings(args)
    record: dict[str, Any] = {
        "check": "gpu_check",
        "dry_run": args.dry_run,
        "command": " ".join(
            ["python", "benchmarks/gpu_check.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "budget_s": budget.seconds,
        "budget": budget,
        "models": names,
        "settings": asdict(settings),
        "machine": machine_info(device),
        "parts": {},
        "ratios": {},
    }
    for line in record["machine"]["warnings"]:
        budget.log(f"warning: {line}")
    budget.log(
        f"{'DRY RUN (CPU, tiny shapes)' if args.dry_run else record['machine'].get('gpu')}: models {names}, "
        f"{settings.steps} steps per measurement, budget {budget.seconds:.0f} s -> {output_dir}"
    )
    if not args.skip_cuda_tests:
        with part(record, "cuda_tests", budget, output_dir, device) as entry:
            timeout = min(args.tests_timeout_s, max(budget.remaining - 30.0 * len(names), 30.0))
            entry["result"] = run_cuda_tests(output_dir, timeout, budget, on_cuda=device.type == "cuda")
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        scratch = Path(tmp)
        tokenizer_dir = args.tokenizer_dir
        if tokenizer_dir is None:
            from reflect_trl.tiny_models import build_tiny_model

            budget.log("building the project's BPE tokenizer")
            tokenizer_dir = str(build_tiny_model(scratch / "tokenizer", arch="gpt2", preset="tiny", seed=0))
        ctx = Context(settings, device, args.dry_run, budget, tokenizer_dir, scratch)
        for name in names:
            spec = MODELS[name]
            reflections = None
            if budget.remaining <= 0:
                skip_part(record, f"reflect:{name}", "time budget exhausted before it started")
            else:
                with part(record, f"reflect:{name}", budget, output_dir, device) as entry:
                    entry["result"] = measure_reflect(ctx, spec)
                    timing = entry["result"]["timing"]
                    reflections = timing["generated_rows_per_step"] * settings.num_iterations
            if budget.remaining <= 0:
                skip_part(record, f"grpo:{name}", "time budget exhausted before it started")
            else:
                with part(record, f"grpo:{name}", budget, output_dir, device) as entry:
                    entry["result"] = measure_grpo(ctx, spec, reflections)
            ours, grpo = (record["parts"][f"{k}:{name}"] for k in ("reflect", "grpo"))
            if ours["status"] == grpo["status"] == "ok":
                record["ratios"][name] = ratios(ours["result"], grpo["result"])
        record["host_peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
        write_report(record, output_dir)
    print(markdown_report({k: v for k, v in record.items() if k != "budget"}))
    budget.log(f"exit status {record['exit_status']} -> {output_dir / 'gpu_check.json'}")
    return int(record["exit_status"])


if __name__ == "__main__":
    sys.exit(main())
