"""Loading models and tokenizers from any ``model_name_or_path`` (hub id for real users, local dir here).

A directory holding a PEFT adapter (``adapter_config.json``) is loaded on top of its base model. A local-looking path
that does not exist is reported as such (:func:`reflect_trl.validation.check_model_path`), never sent to the hub.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from reflect_trl.errors import UsageError, describe
from reflect_trl.validation import check_model_path

DTYPES = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def is_adapter_dir(name_or_path: str) -> bool:
    return (Path(name_or_path) / "adapter_config.json").is_file()


def base_model_of(name_or_path: str) -> str:
    """The base model id of an adapter directory (the path itself otherwise)."""
    if not is_adapter_dir(name_or_path):
        return name_or_path
    config = json.loads((Path(name_or_path) / "adapter_config.json").read_text())
    base = config.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{name_or_path}/adapter_config.json has no base_model_name_or_path")
    return base


def load_tokenizer(name_or_path: str, padding_side: str = "left"):
    from transformers import AutoTokenizer

    check_model_path(name_or_path, "model")
    source = name_or_path
    if is_adapter_dir(name_or_path) and not (Path(name_or_path) / "tokenizer_config.json").is_file():
        source = base_model_of(name_or_path)  # an adapter saved without its tokenizer uses its base's
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side
    tokenizer.truncation_side = "left"
    return tokenizer


def quantization_config(
    load_in_8bit: bool = False, load_in_4bit: bool = False, compute_dtype: str = "bfloat16"
):
    """A bitsandbytes config, or None."""
    if load_in_8bit and load_in_4bit:
        raise ValueError("choose one of load_in_8bit / load_in_4bit, not both")
    if not (load_in_8bit or load_in_4bit):
        return None
    from transformers import BitsAndBytesConfig

    if load_in_8bit:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=DTYPES.get(compute_dtype, torch.bfloat16),
    )


def disable_bnb_cpu_repacking(model) -> None:
    """Work around bitsandbytes 0.50's CPU 4-bit weight repacking (breaks training after an eval forward)."""
    try:
        import bitsandbytes as bnb
    except ImportError:  # pragma: no cover
        return
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False


def load_causal_lm(
    name_or_path: str,
    dtype: str = "auto",
    trainable: bool = True,
    merge_adapter: bool = False,
    quantization: Any = None,
    device_map: Any = None,
):
    """Load a causal LM; an adapter dir is loaded on its base (trainable, or merged for a frozen player)."""
    from transformers import AutoModelForCausalLM

    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    check_model_path(name_or_path, "model")
    kwargs: dict[str, Any] = {"dtype": DTYPES[dtype]}
    if quantization is not None:
        kwargs["quantization_config"] = quantization
    if device_map is not None:
        kwargs["device_map"] = device_map
    base = base_model_of(name_or_path)
    try:
        model = AutoModelForCausalLM.from_pretrained(base, **kwargs)
    except Exception as err:  # a run fails here, with the model named (a corrupt file, a hub error, ...)
        raise RuntimeError(f"cannot load the model {base!r}: {type(err).__name__}: {err}") from err
    if is_adapter_dir(name_or_path):
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, name_or_path, is_trainable=trainable and not merge_adapter)
        if merge_adapter and quantization is None:
            model = model.merge_and_unload()
    if quantization is not None and getattr(quantization, "load_in_4bit", False):
        disable_bnb_cpu_repacking(model)
    return model


def load_tokenizer_checked(ref: str, what: str):
    """:func:`load_tokenizer` with the path check first and a loading error as bad input."""
    check_model_path(ref, what)
    try:
        return load_tokenizer(ref)
    except (OSError, ValueError) as err:
        raise UsageError(
            f"{what} {ref!r}: cannot load its tokenizer ({describe(err).splitlines()[0]})"
        ) from err
