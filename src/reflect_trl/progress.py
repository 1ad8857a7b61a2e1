"""Progress bars of long work (evaluation, data generation, the demo's steps): ``tqdm.auto`` on stderr, quiet
when stderr is not a terminal, under ``--no-progress`` (:func:`disable_progress`) or with
``REFLECT_TRL_NO_PROGRESS=1``."""

from __future__ import annotations

import os
import sys
from typing import Any

#: Environment variable that turns every reflect-trl progress bar off (as ``--no-progress``).
NO_PROGRESS_ENV = "REFLECT_TRL_NO_PROGRESS"


def disable_progress() -> None:
    """Turn reflect-trl's progress bars off for this process and the processes it starts."""
    os.environ[NO_PROGRESS_ENV] = "1"


#: Switches of the dependencies' bars, read when they are imported (also by the processes reflect-trl starts).
DEPENDENCY_BAR_SWITCHES = (
    "HF_HUB_DISABLE_PROGRESS_BARS",
    "HF_DATASETS_DISABLE_PROGRESS_BARS",
    "TQDM_DISABLE",
)


def disable_dependency_bars() -> None:
    """Turn off the bars of the dependencies (transformers' Trainer and weight loading, datasets' ``map``,
    huggingface_hub, any other ``tqdm``): their environment switches for modules and processes still to come, and
    their runtime switches where they are imported already. The command line calls it when
    :func:`progress_enabled` says no; reflect-trl's own bars follow :func:`progress_enabled` anyway."""
    for variable in DEPENDENCY_BAR_SWITCHES:
        os.environ.setdefault(variable, "1")
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    if "datasets" in sys.modules:
        from datasets.utils import logging as datasets_logging

        datasets_logging.disable_progress_bar()


def progress_enabled(requested: bool = True) -> bool:
    """Whether to draw a bar: asked for, not turned off, and stderr is a terminal."""
    if not requested or os.environ.get(NO_PROGRESS_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def progress_bar(total: int | None = None, desc: str | None = None, enabled: bool = True, **kwargs: Any):
    """A ``tqdm.auto`` bar (a no-op bar when :func:`progress_enabled` says no); use ``bar.write`` for lines."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not progress_enabled(enabled), dynamic_ncols=True, **kwargs)


__all__ = [
    "DEPENDENCY_BAR_SWITCHES",
    "NO_PROGRESS_ENV",
    "disable_dependency_bars",
    "disable_progress",
    "progress_bar",
    "progress_enabled",
]
