"""Shared fixtures: tiny offline models built once per session, no network, no wandb."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One intra-op thread: tiny models gain nothing from more, and a busy 2-core machine loses a lot.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A tiny GPT-2 + BPE tokenizer trained on DangerousTaxi text (built offline, deterministic)."""
    from reflect_trl.tiny_models import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-gpt2"), arch="gpt2", preset="nano", seed=0))


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> str:
    from reflect_trl.tiny_models import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), arch="llama", preset="nano", seed=0))
