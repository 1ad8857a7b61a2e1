"""Which checkpoint ``reflect-trl sft`` / ``reflect-trl rl`` resume from (``--resume_from_checkpoint``).

A run killed while it writes ``checkpoint-N/`` leaves a *partial* folder. transformers' ``get_last_checkpoint``
picks the newest ``checkpoint-*`` folder whatever it holds, so a resume from it fails (``FileNotFoundError`` on
``trainer_state.json``), and the string ``true`` from the command line is taken for a path.

A checkpoint is *complete* when it holds what a resume loads: a readable ``trainer_state.json`` (``Trainer.train``
reads it), the model weights (``Trainer._load_from_checkpoint``), the optimizer and scheduler states unless
``save_only_model`` (``Trainer._load_optimizer_and_scheduler`` silently skips missing ones, which would restart the
optimizer), and the files the trainer adds (``ReflectPPOTrainer``: the per-rank training state, the value head, the
reflection player's state, the option labels; :func:`reflect_trl.trainers.rl_state.checkpoint_files`).

No separate completion marker is written: ``Trainer._save_checkpoint`` writes ``trainer_state.json`` after the
weights, the optimizer, the scheduler and the RNG states, and ``ReflectPPOTrainer`` writes its own files before
calling it, so a readable ``trainer_state.json`` already marks a checkpoint whose every file was written (the check of
the other files also catches checkpoints written by older versions, which added the RL state after it). A marker
would need a hook in ``ReflectSFTTrainer`` too and would mark every existing checkpoint partial.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path

from reflect_trl.errors import MissingPathError, UsageError

logger = logging.getLogger(__name__)

#: transformers' names (``trainer.py`` / ``utils``), spelled out so that this module imports neither
TRAINER_STATE_NAME = "trainer_state.json"
WEIGHT_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
)
OPTIMIZER_FILES = ("optimizer.pt", "optimizer.bin")
SCHEDULER_NAME = "scheduler.pt"
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")

#: the spellings of ``--resume_from_checkpoint`` (a string from the command line, a bool from YAML) that mean
#: "the newest complete checkpoint of output_dir" / "do not resume"
TRUE_VALUES = ("true", "yes", "1", "on")
FALSE_VALUES = ("false", "no", "0", "off", "none", "")


def _has_weights(checkpoint: Path) -> bool:
    if any((checkpoint / name).is_file() for name in WEIGHT_FILES):
        return True
    for sub in (p for p in checkpoint.iterdir() if p.is_dir()):
        # DeepSpeed (global_step*), FSDP sharded state, several adapters in sub-folders
        if sub.name.startswith("global_step") or "pytorch_model_fsdp" in sub.name:
            return True
        if any((sub / name).is_file() for name in WEIGHT_FILES[-2:]):
            return True
    return (checkpoint / "pytorch_model_fsdp.bin").is_file()


def _has_optimizer(checkpoint: Path) -> bool:
    if any((checkpoint / name).is_file() for name in OPTIMIZER_FILES):
        return (checkpoint / SCHEDULER_NAME).is_file()
    # DeepSpeed keeps the optimizer in global_step*/, FSDP in optimizer_*/
    return any(
        p.is_dir() and (p.name.startswith("global_step") or "optimizer" in p.name)
        for p in checkpoint.iterdir()
    )


def missing_parts(
    checkpoint: str | Path, required: Sequence[str] = (), needs_optimizer: bool = True
) -> list[str]:
    """What ``checkpoint`` lacks for a resume (empty: it is complete); ``required`` names the trainer's own files."""
    checkpoint = Path(checkpoint)
    missing: list[str] = []
    state = checkpoint / TRAINER_STATE_NAME
    if not state.is_file():
        missing.append(TRAINER_STATE_NAME)
    else:
        try:
            ok = isinstance(json.loads(state.read_text()).get("global_step"), int)
        except (ValueError, OSError, AttributeError):
            ok = False
        if not ok:
            missing.append(f"a readable {TRAINER_STATE_NAME}")
    if not _has_weights(checkpoint):
        missing.append("the model weights")
    if needs_optimizer and not _has_optimizer(checkpoint):
        missing.append("the optimizer/scheduler state")
    missing += [name for name in required if not (checkpoint / name).is_file()]
    return missing


def checkpoints_in(directory: str | Path) -> list[Path]:
    """The ``checkpoint-<step>`` folders of ``directory``, newest (highest step) first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [
        (int(m.group(1)), p) for p in directory.iterdir() if p.is_dir() and (m := CHECKPOINT_RE.match(p.name))
    ]
    return [p for _, p in sorted(found, key=lambda item: item[0], reverse=True)]


def last_complete_checkpoint(
    directory: str | Path, required: Sequence[str] = (), needs_optimizer: bool = True
) -> tuple[Path | None, list[tuple[Path, list[str]]]]:
    """(the newest complete checkpoint of ``directory`` or None, the partial ones newer than it with what they lack)."""
    partial: list[tuple[Path, list[str]]] = []
    for checkpoint in checkpoints_in(directory):
        missing = missing_parts(checkpoint, required, needs_optimizer)
        if not missing:
            return checkpoint, partial
        partial.append((checkpoint, missing))
    return None, partial


def _lacks(missing: list[str]) -> str:
    return f"lacks {', '.join(missing)}"


def resolve_resume_from_checkpoint(
    value: str | bool | None,
    output_dir: str | Path,
    required: Sequence[str] = (),
    needs_optimizer: bool = True,
    warn: bool = True,
) -> str | None:
    """The checkpoint ``--resume_from_checkpoint value`` resumes from (None: a fresh run).

    ``true`` (also ``True``, ``yes``, ``1``, YAML's boolean): the newest complete checkpoint of ``output_dir``; newer
    partial ones are skipped with a one-line warning each (``warn``: on this process). A path: it must exist and be complete. Raises
    :class:`~reflect_trl.errors.UsageError` (a partial checkpoint, naming the last complete one; no complete
    checkpoint) or :class:`~reflect_trl.errors.MissingPathError` (a path that does not exist)."""
    if value is None or value is False:
        return None
    text = "true" if value is True else str(value).strip()
    if text.lower() in FALSE_VALUES:
        return None
    if text.lower() in TRUE_VALUES:
        found, partial = last_complete_checkpoint(output_dir, required, needs_optimizer)
        for checkpoint, missing in partial:
            if found is not None and warn:
                logger.warning(
                    "resume_from_checkpoint %s: skipping the partial checkpoint %s (it %s; the run was probably "
                    "stopped while writing it); resuming from %s",
                    text,
                    checkpoint,
                    _lacks(missing),
                    found,
                )
        if found is None:
            where = f"output_dir {str(output_dir)!r}"
            if not Path(output_dir).is_dir():
                raise UsageError(
                    f"resume_from_checkpoint {text}: {where} does not exist, so there is no checkpoint"
                )
            detail = "; ".join(f"{c.name} {_lacks(m)}" for c, m in partial)
            raise UsageError(
                f"resume_from_checkpoint {text}: no complete checkpoint in {where}"
                + (f" (partial: {detail})" if detail else " (no checkpoint-* folder)")
            )
        return str(found)
    checkpoint = Path(text).expanduser()
    if not checkpoint.exists():
        raise MissingPathError(
            f"resume_from_checkpoint {text!r} does not exist (give a checkpoint folder such as "
            f"{Path(output_dir) / 'checkpoint-500'}, or true for the newest complete checkpoint of output_dir)"
        )
    if not checkpoint.is_dir():
        raise UsageError(f"resume_from_checkpoint {text!r} is a file, not a checkpoint folder")
    missing = missing_parts(checkpoint, required, needs_optimizer)
    if missing:
        found, _ = last_complete_checkpoint(checkpoint.parent, required, needs_optimizer)
        hint = (
            f"the last complete checkpoint is {found} (resume from it, or give true to pick it)"
            if found is not None
            else f"{checkpoint.parent} holds no complete checkpoint to resume from"
        )
        raise UsageError(
            f"resume_from_checkpoint {text!r} is a partial checkpoint (it {_lacks(missing)}; the run was probably "
            f"stopped while writing it): {hint}"
        )
    return str(checkpoint)


__all__ = [
    "checkpoints_in",
    "last_complete_checkpoint",
    "missing_parts",
    "resolve_resume_from_checkpoint",
]
