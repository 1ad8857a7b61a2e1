"""Run ``reflect-trl <argv>`` (rl or sft) for tests/trainers/test_resume_checkpoints.py.

With ``REFLECT_TEST_STALL_SENTINEL`` and ``REFLECT_TEST_STALL_STEP`` set, the save of the checkpoint of that step
stalls once the weights, the optimizer and the scheduler (and ReflectPPOTrainer's own files) are written: it writes
the sentinel file and sleeps, so the test can kill the process (SIGKILL) in the middle of the save. Every run records
the checkpoint ``train()`` resumes from in ``<output_dir>/resumed_from.json``."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from transformers import Trainer

from reflect_trl.cli import main

sentinel = os.environ.get("REFLECT_TEST_STALL_SENTINEL")
if sentinel:
    stall_step = int(os.environ["REFLECT_TEST_STALL_STEP"])
    save_rng_state = Trainer._save_rng_state

    def stalled_save_rng_state(self, output_dir):
        if self.state.global_step == stall_step:
            Path(sentinel).write_text(str(output_dir))
            time.sleep(300)  # killed here
        return save_rng_state(self, output_dir)

    Trainer._save_rng_state = stalled_save_rng_state

train = Trainer.train


def recording_train(self, resume_from_checkpoint=None, *args, **kwargs):
    record = Path(self.args.output_dir) / "resumed_from.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(resume_from_checkpoint))
    return train(self, resume_from_checkpoint, *args, **kwargs)


Trainer.train = recording_train

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
