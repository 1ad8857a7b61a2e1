"""Dependency notices that a reflect-trl user cannot act on, silenced once for the library and the command line."""

from __future__ import annotations

import logging
import warnings

#: FutureWarnings that TRL 1.16 triggers inside transformers 5.24 (its own calls of renamed methods); nothing a
#: reflect-trl user can change. Matched by message, so any other warning still shows.
_DEPENDENCY_DEPRECATIONS = (
    "`is_gradient_checkpointing` is deprecated",
    "`gradient_checkpointing_disable` is deprecated",
    "`gradient_checkpointing_enable` is deprecated",
)


_done = False


def quiet_dependencies() -> None:
    """Silence import-time notices of optional kernels and the dependency deprecations above (once per process;
    ``import reflect_trl`` calls it, so the library and the command line print the same).

    bitsandbytes (imported by peft at import time) logs that its optional CPU 4-bit kernel package ``kernels`` is
    missing; reflect-trl loads 4-bit models only when a recipe asks for it, so the notice is noise."""
    global _done
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    if _done:
        return
    _done = True
    for message in _DEPENDENCY_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)
