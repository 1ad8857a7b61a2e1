"""The training state of ``ReflectPPOTrainer`` (a mixin of its hooks): the optimizer's parameter groups and the
learning-rate schedule, and what a checkpoint holds besides GRPOTrainer's own files -- the task sampler (curriculum
stage and RNG), replay buffer, rollout counter and memos per rank, the value head, the option labels and the
reflection player when it learns -- so that a resumed run continues exactly as the uninterrupted one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from reflect_trl.prompts import LABELS_FILE, write_option_labels
from reflect_trl.reflection.cache import CachedReflectionPlayer
from reflect_trl.trainers.reflection_learner import STATE_FILE as REFLECTION_STATE_FILE
from reflect_trl.trainers.reflection_learner import SUBMODULE

STATE_FILE = "reflect_state_rank{rank}.pt"
VALUE_HEAD_FILE = "value_head.pt"
#: written beside a run whose reflection player learned: the oracle-labelled reflection turns it trained on
ORACLE_LABELS_FILE = "reflection_labels.json"


def checkpoint_files(args) -> list[str]:
    """The files a checkpoint of a run configured by ``args`` (a ``ReflectPPOConfig``) holds besides Trainer's own,
    all of which a resume with ``args`` reads: every rank's training state, the option labels, the value head
    (``gae``) and the reflection player's state (``train_reflection``)."""
    files = [STATE_FILE.format(rank=rank) for rank in range(args.world_size)] + [LABELS_FILE]
    if args.advantage_estimator == "gae":
        files.append(VALUE_HEAD_FILE)
    if args.train_reflection:
        files.append(REFLECTION_STATE_FILE)
    return files


class TrainingStateMixin:
    """The state of an RL run beyond the policy's weights, how it is saved and restored, and its optimizer and
    schedule (the reflection player's parameter groups, the per-stage restart)."""

    # ----------------------------------------------------------------------------------- checkpoint / resume
    def _reflect_state(self) -> dict[str, Any]:
        return {
            "tasks": self.tasks.state_dict(),
            "replay": self.replay.state_dict(),
            "rollouts": self._rollouts,
            # the greedy reflection memo: a resumed run generates exactly the reflections the uninterrupted one did
            "reflection_memo": self.reflection.state_dict()
            if isinstance(self.reflection, CachedReflectionPlayer)
            else None,
            "ref_logps_memo": self.ref_memo.state_dict() if self.ref_memo is not None else None,
            "oracle_labels": self._oracle_labels,
        }

    def _save_checkpoint(self, model, trial):
        """This trainer's files first, then Trainer's (weights, optimizer, RNG, and ``trainer_state.json`` last), so a
        checkpoint with a readable ``trainer_state.json`` is complete (:mod:`reflect_trl.trainers.checkpoints`);
        a run killed while saving leaves a partial folder that ``--resume_from_checkpoint true`` skips."""
        out = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        out.mkdir(parents=True, exist_ok=True)
        torch.save(self._reflect_state(), out / STATE_FILE.format(rank=self.accelerator.process_index))
        if self.reflection_learner is not None and self.args.should_save:
            self.reflection_learner.save_state(out)
        # every rank's state is on disk before the main process can write trainer_state.json
        self.accelerator.wait_for_everyone()
        super()._save_checkpoint(model, trial)  # its save_model writes the extras (_save_extras) too

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = Path(checkpoint) / STATE_FILE.format(rank=self.accelerator.process_index)
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: {checkpoint} was not written by ReflectPPOTrainer")
        state = torch.load(path, weights_only=False)
        self.tasks.load_state_dict(state["tasks"])
        if self.args.replay_buffer_size > 0:
            self.replay.load_state_dict(state["replay"])
        self._rollouts = int(state["rollouts"])
        self._oracle_labels = int(state.get("oracle_labels", 0))
        if isinstance(self.reflection, CachedReflectionPlayer) and state.get("reflection_memo") is not None:
            self.reflection.load_state_dict(state["reflection_memo"])
            # every rollout logs its hit rate, so the last logged counts are the memo's own at a checkpoint
            self._memo_counts["reflection"] = (self.reflection.hits, self.reflection.lookups)
        if self.ref_memo is not None and state.get("ref_logps_memo") is not None:
            self.ref_memo.load_state_dict(state["ref_logps_memo"])
            self._memo_counts["ref"] = (self.ref_memo.hits, self.ref_memo.lookups)
        if self.value_head is not None:
            self.value_head.load_state_dict(torch.load(Path(checkpoint) / VALUE_HEAD_FILE, weights_only=True))
        if self.reflection_learner is not None:
            self.reflection_learner.load_state(Path(checkpoint))

    def _save_extras(self, out: Path) -> None:
        """What a policy directory holds besides the weights: the option labels and the value head (``gae``)."""
        write_option_labels(out, self.option_head.labels)
        if self.value_head is not None:
            torch.save(self.value_head.state_dict(), out / VALUE_HEAD_FILE)
        if self.reflection_learner is not None:
            self.reflection_learner.save_model(out)
            # how many oracle-labelled reflection turns the run trained on (a label-matched control reads it)
            (out / ORACLE_LABELS_FILE).write_text(
                json.dumps(
                    {
                        "oracle_labelled_turns": self._oracle_labels,
                        "reflection_reward": self.args.reflection_reward,
                        "reflection_objective": self.args.reflection_objective,
                    }
                )
                + "\n"
            )

    def _save(self, output_dir: str | None = None, state_dict=None):
        """Trainer's save of the policy, without the reflection player riding in it (saved on its own)."""
        if self.reflection_learner is None:
            return super()._save(output_dir, state_dict)
        if state_dict is not None:
            state_dict = {k: v for k, v in state_dict.items() if f"{SUBMODULE}." not in k}
        with self.reflection_learner.detached(self.accelerator.unwrap_model(self.model)):
            return super()._save(output_dir, state_dict)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            self._save_extras(Path(output_dir or self.args.output_dir))

    def create_optimizer(self, model=None):
        """Trainer's optimizer, with the reflection player's parameters in groups of their own learning rate."""
        optimizer = super().create_optimizer(model)
        if self.reflection_learner is not None:
            self.reflection_learner.split_param_groups(self.optimizer, self.args.reflection_learning_rate)
        return optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """Trainer's scheduler, or with ``lr_schedule_per_stage`` the same schedule restarted at every curriculum
        stage: step t of stage k (starting at s_k, lasting L_k steps) gets the factor the schedule gives step
        t - s_k of a run of L_k steps (its warm-up included)."""
        if not self.args.lr_schedule_per_stage or self.lr_scheduler is not None:
            return super().create_scheduler(num_training_steps, optimizer)
        from transformers import get_scheduler

        starts = list(self.curriculum.stage_starts) + [num_training_steps]
        factors: list[float] = []
        for start, end in zip(starts, starts[1:], strict=False):
            length = max(end - start, 1)
            probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
            schedule = get_scheduler(
                self.args.lr_scheduler_type,
                optimizer=probe,
                num_warmup_steps=self.args.get_warmup_steps(length),
                num_training_steps=length,
                scheduler_specific_kwargs=self.args.lr_scheduler_kwargs,
            )
            for _ in range(end - start):
                factors.append(probe.param_groups[0]["lr"])
                probe.step()
                schedule.step()
        factors = factors or [1.0]
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer or self.optimizer, lambda step: factors[min(step, len(factors) - 1)]
        )
        self._created_lr_scheduler = True
        return self.lr_scheduler
