"""The up-front checks shared by the subcommands and the error taxonomy of the command line."""

from __future__ import annotations

import json

import pytest
import yaml

from reflect_trl.errors import MissingPathError, UsageError, is_usage_error, usage_errors
from reflect_trl.validation import (
    check_env,
    check_model_path,
    looks_like_local_path,
    removed_on_failure,
)


def test_local_looking_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    for ref in ("./x", "../x", "/x", "~/x", "models/foo", "outputs/taxi/rl", "x/", "a\\b"):
        assert looks_like_local_path(ref), ref
    for ref in ("gpt2", "openai-community/gpt2", "nomodels/foo"):
        assert not looks_like_local_path(ref), ref


def test_check_model_path(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    check_model_path(tiny_model_dir, "model_name_or_path")  # a saved model
    check_model_path("org/name", "model_name_or_path")  # a hub id is left to the hub
    with pytest.raises(
        MissingPathError, match=r"model_name_or_path 'models/foo' does not exist \(a local directory"
    ):
        check_model_path("models/foo", "model_name_or_path")
    with pytest.raises(UsageError, match="is a directory but not a saved model"):
        check_model_path("models", "policy")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(UsageError, match="is a file"):
        check_model_path("weights.bin", "policy")


def test_loaders_never_send_a_missing_local_path_to_the_hub(tmp_path):
    from reflect_trl.models import load_causal_lm, load_tokenizer

    for load in (load_causal_lm, load_tokenizer):
        with pytest.raises(MissingPathError, match="does not exist"):
            load(str(tmp_path / "no" / "model"))


def test_check_env():
    assert check_env("taxi", {"horizon": 5}, ["pickup"]).horizon == 5
    with pytest.raises(UsageError, match="env_name: unknown environment 'nope'"):
        check_env("nope")
    with pytest.raises(UsageError, match=r"env_kwargs \{'horizn': 5\}: not accepted by environment 'taxi'"):
        check_env("taxi", {"horizn": 5})
    with pytest.raises(UsageError, match="taxi: unknown stage 'nope'"):
        check_env("taxi", stages=["pickup", "nope"])


def test_usage_errors_converts_bad_input_only_inside_the_block():
    with pytest.raises(UsageError, match="recipe.yaml: bad value"), usage_errors("recipe.yaml"):
        raise ValueError("bad value")
    with pytest.raises(UsageError, match="^unknown environment 'x'$"), usage_errors():
        raise KeyError("unknown environment 'x'")
    with pytest.raises(MissingPathError), usage_errors():
        raise FileNotFoundError("data.jsonl")
    with pytest.raises(UsageError), usage_errors():
        yaml.safe_load("a: [b")
    with pytest.raises(UsageError), usage_errors():
        json.loads("{")
    with pytest.raises(RuntimeError), usage_errors():  # not bad input: a failure
        raise RuntimeError("server down")
    assert is_usage_error(UsageError("x")) and is_usage_error(MissingPathError("x"))
    assert not is_usage_error(ValueError("x")) and not is_usage_error(FloatingPointError("nan"))


def test_removed_on_failure_only_removes_what_it_created(tmp_path):
    created = tmp_path / "new" / "run"
    with pytest.raises(RuntimeError), removed_on_failure(created):
        created.mkdir(parents=True)
        (created / "wandb").mkdir()
        raise RuntimeError("setup failed")
    assert not (tmp_path / "new").exists()
    existing = tmp_path / "old"
    (existing / "keep").mkdir(parents=True)
    with pytest.raises(RuntimeError), removed_on_failure(existing / "run"):
        (existing / "run").mkdir()
        raise RuntimeError("setup failed")
    assert (existing / "keep").is_dir() and not (existing / "run").exists()
    with removed_on_failure(tmp_path / "fine"):
        (tmp_path / "fine").mkdir()
    assert (tmp_path / "fine").is_dir()
