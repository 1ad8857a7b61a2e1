"""LoRA targets that work for any architecture.

``lora_target_modules`` unset (or ``all-linear``, peft's own value) puts adapters on every linear layer of the model but
its output layer, whatever the layers are called (GPT-2's ``c_attn``/``c_proj``/``c_fc``, Llama's ``q_proj`` ...
``down_proj``, ...). A list of names (or a regular expression) is kept as given, with peft's own matching, and is
checked against the model first: targets that match nothing are an error naming the model type and its linear module
names, before any training starts (peft's own message names neither).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from reflect_trl.errors import UsageError

#: peft's value for "every linear layer except the output layer"; the default here.
ALL_LINEAR = "all-linear"


def _is_linear(module: torch.nn.Module) -> bool:
    """A layer peft can adapt as a linear one (``nn.Linear``, or GPT-2's ``Conv1D``)."""
    if isinstance(module, torch.nn.Linear):
        return True
    return type(module).__name__ == "Conv1D"  # transformers.pytorch_utils.Conv1D (GPT-2 family)


def linear_modules(model: torch.nn.Module) -> list[str]:
    """Full names of the model's linear layers, the output layer (``get_output_embeddings``) excluded."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [name for name, module in model.named_modules() if _is_linear(module) and module is not output]


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The distinct last name parts of :func:`linear_modules` (what a ``lora_target_modules`` list names)."""
    return sorted({name.rsplit(".", 1)[-1] for name in linear_modules(model)})


def matched_modules(model: torch.nn.Module, targets: str | Sequence[str] | None) -> list[str]:
    """The linear layers ``targets`` selects, with peft's rules: ``all-linear`` (or None) every one, a string a
    regular expression over the full name (``re.fullmatch``), a list the names equal to a target or ending in
    ``.target``."""
    names = linear_modules(model)
    if targets is None or targets == ALL_LINEAR:
        return names
    if isinstance(targets, str):
        return [n for n in names if re.fullmatch(targets, n)]
    return [n for n in names if any(n == t or n.endswith(f".{t}") for t in targets)]


def model_type(model: torch.nn.Module) -> str:
    """``config.model_type`` of a (possibly wrapped) model, or its class name."""
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) or type(model).__name__


def check_lora_targets(model: torch.nn.Module, targets: str | Sequence[str] | None) -> list[str]:
    """The layers ``targets`` adapts; a :class:`UsageError` naming the model type and its linear module names when
    it adapts none."""
    matched = matched_modules(model, targets)
    if not matched:
        shown = targets if isinstance(targets, str) else list(targets or [])
        raise UsageError(
            f"lora_target_modules {shown!r} match no layer of this {model_type(model)!r} model; its linear modules "
            f"are {linear_module_names(model)} (use lora_target_modules: {ALL_LINEAR}, the default, or some of those)"
        )
    return matched


def meta_model(name_or_path: str) -> torch.nn.Module:
    """The model's module tree without its weights (built on the meta device from its config): enough to check
    LoRA targets before the real load."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from reflect_trl.models import base_model_of

    config = AutoConfig.from_pretrained(base_model_of(name_or_path))
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def lora_config(model_args: Any, model: torch.nn.Module | str | None = None):
    """TRL's ``get_peft_config(model_args)`` with ``all-linear`` when ``lora_target_modules`` is unset; when
    ``model`` (a model or its name/path) is given, the targets are checked against it (:func:`check_lora_targets`).
    None without ``use_peft``."""
    from trl import get_peft_config

    if not getattr(model_args, "use_peft", False):
        return None
    targets = model_args.lora_target_modules
    if targets is None or (not isinstance(targets, str) and list(targets) == [ALL_LINEAR]):
        targets = ALL_LINEAR
    model_args.lora_target_modules = targets
    if model is not None:
        check_lora_targets(meta_model(model) if isinstance(model, str) else model, targets)
    return get_peft_config(model_args)


__all__ = [
    "ALL_LINEAR",
    "check_lora_targets",
    "linear_module_names",
    "linear_modules",
    "lora_config",
    "matched_modules",
    "meta_model",
    "model_type",
]
