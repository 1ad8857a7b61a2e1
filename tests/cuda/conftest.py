"""Fixtures of the CUDA tests: tiny models of the ``tiny`` preset (2 layers, hidden size 64), built once."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory) -> str:
    from reflect_trl.tiny_models import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("cuda-gpt2"), arch="gpt2", preset="tiny", seed=0))


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> str:
    from reflect_trl.tiny_models import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("cuda-llama"), arch="llama", preset="tiny", seed=0))
