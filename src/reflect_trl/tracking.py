"""Experiment tracking defaults shared by the trainers: Weights & Biases runs offline unless told otherwise.

Call :func:`configure_tracking` with the trainer's ``report_to`` and ``output_dir`` *before* the trainer is
created (``wandb.init`` reads the environment when training starts). With W&B requested and neither
``WANDB_API_KEY`` nor ``WANDB_MODE`` set, it sets ``WANDB_MODE=offline`` and, unless already set,
``WANDB_DIR=<output_dir>`` and ``WANDB_PROJECT=reflect-trl``; offline runs can be uploaded later with
``wandb sync <output_dir>/wandb/offline-run-*``. ``report_to: none`` turns all trackers off.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_WANDB_PROJECT = "reflect-trl"


def reported_integrations(report_to: str | Sequence[str] | None) -> list[str]:
    """``report_to`` as a list of integration names (``"none"``/None -> ``[]``)."""
    if report_to is None:
        return []
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    return [n for n in names if n and n != "none"]


def wants_wandb(report_to: str | Sequence[str] | None) -> bool:
    names = reported_integrations(report_to)
    return "wandb" in names or "all" in names


def configure_tracking(
    report_to: str | Sequence[str] | None, output_dir: str | Path | None
) -> dict[str, str]:
    """Set the W&B environment defaults described in the module docstring; return the variables it set."""
    changed: dict[str, str] = {}
    if not wants_wandb(report_to):
        return changed
    if not os.environ.get("WANDB_API_KEY") and not os.environ.get("WANDB_MODE"):
        changed["WANDB_MODE"] = "offline"
    if output_dir is not None and not os.environ.get("WANDB_DIR"):
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        changed["WANDB_DIR"] = str(Path(output_dir).resolve())
    if not os.environ.get("WANDB_PROJECT"):
        changed["WANDB_PROJECT"] = DEFAULT_WANDB_PROJECT
    os.environ.update(changed)
    if changed.get("WANDB_MODE") == "offline":
        logger.info(
            "W&B logs offline to %s (no WANDB_API_KEY or WANDB_MODE set)", os.environ.get("WANDB_DIR", ".")
        )
    return changed


__all__ = ["DEFAULT_WANDB_PROJECT", "configure_tracking", "reported_integrations", "wants_wandb"]
