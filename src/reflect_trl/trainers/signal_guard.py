"""A real skip of the optimizer steps without a learning signal (``ReflectPPOConfig.skip_no_signal_steps``).

``compute_loss`` knows, for every micro-batch, whether its gradient-accumulation window has a turn with a non-zero
advantage on any process (``window_signal_turns``, summed over the processes in ``ReflectPPOTrainer._prepare_inputs``),
so every process decides alike. On a window without one:

* the loss is multiplied by 0 and backward runs as on any step, so DDP's / FSDP's gradient all-reduce and the
  Trainer's gradient clipping (a collective under FSDP) happen on every process;
* the optimizer's ``step`` returns without updating anything (no AdamW moment, weight decay or step count moves). The
  guard wraps the torch optimizer that Trainer creates, before accelerate wraps it in its ``AcceleratedOptimizer``:
  with fp16 the ``GradScaler``'s ``step`` / ``update`` still run around it and its state stays consistent;
* the learning-rate scheduler (:class:`GuardedScheduler` around Trainer's) does not step either: the schedule
  advances with the optimizer steps taken, and lags the step count by the skipped ones.

The Trainer still counts the step: ``global_step`` advances, and ``max_steps``, logging, saving, evaluation and the
step curriculum see it. DeepSpeed steps its optimizer and scheduler inside ``accelerator.backward`` (its engine), out
of reach of these wraps: the option is refused there (:func:`check_skip_supported`)."""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import torch
from transformers.optimization import GreedyLR


@dataclass
class SkipGuard:
    """Whether the coming optimizer step is skipped (set by ``compute_loss`` on every micro-batch of its window,
    consumed by the optimizer's step) and whether the scheduler's next step follows a skipped optimizer step."""

    skip: bool = False
    skipped_steps: int = 0
    hold_scheduler: bool = False

    def optimizer_step(self, step, *args: Any, **kwargs: Any) -> Any:
        self.hold_scheduler, self.skip = self.skip, False
        if self.hold_scheduler:
            self.skipped_steps += 1
            return None
        return step(*args, **kwargs)

    def scheduler_step(self, step, *args: Any, **kwargs: Any) -> Any:
        if self.hold_scheduler:
            self.hold_scheduler = False
            return None
        return step(*args, **kwargs)


def guard_optimizer(optimizer: torch.optim.Optimizer, guard: SkipGuard) -> None:
    """Route the torch optimizer's ``step`` through ``guard`` (the one accelerate wraps, on a second ``train()``).
    A bound method, as torch's LR schedulers expect of ``optimizer.step``; installed once."""
    # accelerate's AcceleratedOptimizer holds the torch one
    inner = getattr(optimizer, "optimizer", optimizer)
    if getattr(inner.step, "signal_guard", None) is guard:
        return
    original = inner.step

    def step(self, *args: Any, **kwargs: Any) -> Any:
        return guard.optimizer_step(original, *args, **kwargs)

    step.signal_guard = guard  # type: ignore[attr-defined]
    inner.step = types.MethodType(step, inner)


class GuardedScheduler:
    """An LR scheduler that does not step after a skipped optimizer step; everything else (``get_last_lr``,
    ``state_dict``, ``load_state_dict``, ...) is the wrapped scheduler's. A wrapper, not an attribute set on the
    scheduler: a scheduler's ``state_dict`` is its ``__dict__``, which a checkpoint pickles."""

    def __init__(self, scheduler, guard: SkipGuard) -> None:
        self.scheduler, self.guard = scheduler, guard

    def step(self, *args: Any, **kwargs: Any) -> Any:
        return self.guard.scheduler_step(self.scheduler.step, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in ("scheduler", "guard"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.scheduler, name)


def check_skip_supported(args, deepspeed: bool) -> None:
    """``skip_no_signal_steps`` cannot skip DeepSpeed's steps (taken inside its engine's backward): refuse it."""
    if args.skip_no_signal_steps and deepspeed:
        raise ValueError(
            "skip_no_signal_steps is not supported with DeepSpeed: its engine steps the optimizer and the scheduler "
            "inside backward, where a step cannot be skipped; use DDP or FSDP, or drop the option"
        )


class SignalSkipMixin:
    """``ReflectPPOTrainer``'s hooks for ``skip_no_signal_steps`` (see the module): the guard on the optimizer and the
    scheduler, and the decision per micro-batch (:meth:`_skip_without_signal`, called by ``compute_loss``)."""

    _skip_guard: SkipGuard | None = None

    def create_optimizer(self, model=None):
        optimizer = super().create_optimizer(model)
        if self.args.skip_no_signal_steps and self.optimizer is not None:
            self._skip_guard = self._skip_guard or SkipGuard()
            guard_optimizer(self.optimizer, self._skip_guard)
        return optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        super().create_scheduler(num_training_steps, optimizer)
        scheduler = self.lr_scheduler
        # the plateau schedulers step on evaluation metrics, not with the optimizer: left as they are
        plateau = (torch.optim.lr_scheduler.ReduceLROnPlateau, GreedyLR)
        if self._skip_guard is not None and not isinstance(scheduler, (GuardedScheduler, *plateau)):
            self.lr_scheduler = GuardedScheduler(scheduler, self._skip_guard)
        return self.lr_scheduler

    def _skip_without_signal(self, loss: torch.Tensor, inputs: dict[str, Any]) -> torch.Tensor:
        """With ``skip_no_signal_steps``: log whether this micro-batch's window is skipped, tell the guard, and zero
        the loss of a skipped window (its backward still runs: the same collectives on every process)."""
        if not self.args.skip_no_signal_steps:
            return loss
        skipped = bool(inputs["window_signal_turns"] == 0)  # a global count: the same on every process
        self._metrics["train"]["signal/skipped_step_share"].append(float(skipped))
        if self._skip_guard is not None:
            self._skip_guard.skip = skipped
        return loss * 0.0 if skipped else loss


__all__ = ["GuardedScheduler", "SignalSkipMixin", "SkipGuard", "check_skip_supported", "guard_optimizer"]
