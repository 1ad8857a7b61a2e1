"""Resume of a CUDA run: a bf16 run stopped at a checkpoint and resumed logs what the uninterrupted run logged.

The reflections are sampled on the device, so the resumed run must also get the CUDA RNG state back."""

from __future__ import annotations

import pytest
from _cuda_helpers import CUDA_MARKS, make_trainer
from transformers import TrainerCallback

pytestmark = CUDA_MARKS
KEYS = ("loss", "env/success_rate", "env/return", "entropy", "approx_kl", "kl", "rollout/reflection_tokens")


class StopAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def test_resumed_cuda_run_reproduces_the_uninterrupted_run(gpt2_dir, tmp_path):
    common = dict(
        max_steps=4,
        reflection_temperature=1.0,  # sampled on the device: the CUDA RNG state is part of the checkpoint
        beta=0.05,  # the reference log-probs (and their memo) are saved with the run too
        save_strategy="steps",
        save_steps=2,
    )
    full = make_trainer(gpt2_dir, tmp_path / "full", **common)
    full.train()
    expected = [h for h in full.state.log_history if "loss" in h and h["step"] > 2]

    first = make_trainer(gpt2_dir, tmp_path / "part", **common)
    first.add_callback(StopAt(2))
    first.train()
    checkpoint = tmp_path / "part" / "checkpoint-2"
    assert (checkpoint / "rng_state.pth").is_file()
    resumed = make_trainer(gpt2_dir, tmp_path / "part", **common)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    got = [h for h in resumed.state.log_history if "loss" in h and h["step"] > 2]
    assert len(got) == len(expected) == 2
    for g, w in zip(got, expected, strict=True):
        for key in KEYS:
            if key in w:
                assert g[key] == pytest.approx(w[key], rel=1e-3, abs=1e-5), (key, g, w)
