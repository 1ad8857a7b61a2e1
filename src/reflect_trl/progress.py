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


__all__ = ["NO_PROGRESS_ENV", "disable_progress", "progress_bar", "progress_enabled"]
