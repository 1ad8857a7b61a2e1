"""The trainers' progress output: bars only where reflect-trl draws bars, and logs whose numbers are numbers.

transformers' ``ProgressCallback`` draws its bars whenever ``disable_tqdm`` is False (also into a redirected log) and
prints every log with its floats formatted as strings (``{'loss': '0.6931'}``), as does ``PrinterCallback``.
:class:`ReflectProgressCallback` replaces both: a bar only when :func:`reflect_trl.progress.progress_enabled` says so
(stderr is a terminal, no ``--no-progress``) and ``disable_tqdm`` is not set, and each log as one line of JSON with
numbers as numbers (floats to 4 significant digits): ``{"loss": 0.6931, "grad_norm": 1.25, "epoch": 0.5}``.
"""

from __future__ import annotations

import json
import math
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from reflect_trl.progress import progress_enabled


def _number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)  # JSON has no NaN/inf
        return float(f"{value:.4g}")
    return value


def format_logs(logs: dict[str, Any]) -> str:
    """One log as a JSON line, numbers kept as numbers (``total_flos`` left out, as transformers does)."""
    shown = {k: _number(v) for k, v in logs.items() if k != "total_flos"}
    return json.dumps(shown, default=str)


class ReflectProgressCallback(TrainerCallback):
    """Training / evaluation bars on a terminal only, and every log printed as a JSON line of numbers."""

    def __init__(self) -> None:
        self.training_bar = None
        self.prediction_bar = None
        self._current_step = 0

    @staticmethod
    def _bars(args, state) -> bool:
        return state.is_world_process_zero and not args.disable_tqdm and progress_enabled()

    def on_train_begin(self, args, state, control, **kwargs):
        if self._bars(args, state):
            from tqdm.auto import tqdm

            self.training_bar = tqdm(total=state.max_steps, dynamic_ncols=True, disable=False)
        self._current_step = 0

    def on_step_end(self, args, state, control, **kwargs):
        if self.training_bar is not None:
            self.training_bar.update(state.global_step - self._current_step)
        self._current_step = state.global_step

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        if eval_dataloader is None or not self._bars(args, state):
            return
        try:
            total = len(eval_dataloader)
        except TypeError:  # an iterable without a length
            return
        if self.prediction_bar is None:
            from tqdm.auto import tqdm

            leave = self.training_bar is None
            self.prediction_bar = tqdm(total=total, leave=leave, dynamic_ncols=True, disable=False)
        self.prediction_bar.update(1)

    def _close_prediction_bar(self) -> None:
        if self.prediction_bar is not None:
            self.prediction_bar.close()
            self.prediction_bar = None

    def on_evaluate(self, args, state, control, **kwargs):
        self._close_prediction_bar()

    def on_predict(self, args, state, control, **kwargs):
        self._close_prediction_bar()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        line = format_logs(logs)
        if self.training_bar is not None:
            self.training_bar.write(line)
        else:
            print(line, flush=True)

    def on_train_end(self, args, state, control, **kwargs):
        if self.training_bar is not None:
            self.training_bar.close()
            self.training_bar = None


def use_reflect_progress(trainer) -> None:
    """Replace the trainer's ``ProgressCallback`` / ``PrinterCallback`` with :class:`ReflectProgressCallback`."""
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    if not any(isinstance(cb, ReflectProgressCallback) for cb in trainer.callback_handler.callbacks):
        trainer.add_callback(ReflectProgressCallback())


__all__ = ["ReflectProgressCallback", "format_logs", "use_reflect_progress"]
