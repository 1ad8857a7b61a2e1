"""Guards for the GRPOTrainer internals ReflectPPOTrainer relies on. If TRL changes them, these fail loudly.

ReflectPPOTrainer overrides ``_generate_and_score_completions`` (TRL's documented extension point),
``_get_per_token_logps_and_entropies`` and ``compute_loss``; it relies on ``_compute_loss`` calling the
log-prob hook once for the policy, reading ``advantages``/``old_per_token_logps``/``ref_per_token_logps`` from the
batch, and on ``_prepare_inputs`` splitting our batch with ``split_tensor_dict``.
"""

from __future__ import annotations

import inspect

import trl
from packaging.version import Version
from trl import GRPOTrainer


def test_trl_minor_is_the_tested_one():
    assert Version("1.16") <= Version(trl.__version__) < Version("1.17"), trl.__version__


def test_generate_and_score_is_called_from_prepare_inputs():
    src = inspect.getsource(GRPOTrainer._prepare_inputs)
    assert "self._generate_and_score_completions(generation_batch)" in src
    assert "split_tensor_dict(generation_batch, self.args.steps_per_generation)" in src


def test_logps_hook_signature():
    params = list(inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).parameters)
    assert params[:7] == [
        "self",
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
    ]


def test_compute_loss_reads_our_batch_keys():
    src = inspect.getsource(GRPOTrainer._compute_loss)
    assert src.count("self._get_per_token_logps_and_entropies(") == 1
    for key in (
        'inputs["advantages"]',
        'inputs.get("old_per_token_logps")',
        'inputs["ref_per_token_logps"]',
        'inputs["prompt_ids"]',
        'inputs["completion_ids"]',
        'inputs["completion_mask"]',
    ):
        assert key in src, key
    assert "advantages.dim() == 1" in src  # per-sample advantages accepted


def test_compute_loss_entry_point():
    src = inspect.getsource(GRPOTrainer.compute_loss)
    assert "self._compute_loss(model, inputs)" in src


def test_checkpoint_hooks_exist():
    for name in ("_save_checkpoint", "_load_optimizer_and_scheduler", "save_model"):
        assert callable(getattr(GRPOTrainer, name))
