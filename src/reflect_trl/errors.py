"""The error taxonomy of the ``reflect-trl`` command line.

* :class:`UsageError` (a ``ValueError``) -- the input is wrong (recipe file, YAML, unknown key or flag, out-of-range
  value, data set row, model path, environment name, option labels, server settings), and :class:`MissingPathError`
  (a ``FileNotFoundError``) -- a local path given by the user does not exist. ``reflect-trl`` prints the message and
  exits with status 2 (:func:`is_usage_error`).
* Anything else raised while a command runs is a runtime failure (a NaN loss, a server that keeps failing, a bug):
  one line, exit status 1.

Checks run before anything is written; :func:`usage_errors` turns the ``ValueError`` / ``KeyError`` /
``FileNotFoundError`` / ``TypeError`` / YAML errors raised *inside such a check* into a :class:`UsageError`, so a
genuine bug deep in training is never reported as bad input. ``--debug`` (or ``REFLECT_TRL_DEBUG=1``) adds the
traceback.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

#: Environment variable that makes ``reflect-trl`` print tracebacks (as ``reflect-trl --debug``).
DEBUG_ENV = "REFLECT_TRL_DEBUG"


class UsageError(ValueError):
    """Bad input a person can fix: the message names the file / field / value and what to do."""


class MissingPathError(FileNotFoundError):
    """A local path given by the user does not exist (the message names the setting and the path)."""


def is_usage_error(err: BaseException) -> bool:
    """Bad input (exit status 2) rather than a runtime failure (exit status 1)."""
    return isinstance(err, UsageError | MissingPathError)


def debug_enabled() -> bool:
    """True under ``reflect-trl --debug`` or ``REFLECT_TRL_DEBUG=1``."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def describe(err: BaseException) -> str:
    """The message of an exception as a person reads it (a ``KeyError``'s text without its quotes)."""
    if isinstance(err, KeyError) and len(err.args) == 1 and isinstance(err.args[0], str):
        return err.args[0]
    text = str(err).strip()
    return text or type(err).__name__


def _yaml_error_types() -> tuple[type[BaseException], ...]:
    try:
        import yaml
    except ImportError:  # pragma: no cover - yaml comes with transformers
        return ()
    return (yaml.YAMLError,)


@contextmanager
def usage_errors(context: str | None = None) -> Iterator[None]:
    """Inside a check of the user's input: turn the errors that mean "bad input" into :class:`UsageError`
    (prefixed by ``context``, e.g. the recipe file)."""
    try:
        yield
    except (UsageError, MissingPathError):
        raise
    except (ValueError, KeyError, TypeError, FileNotFoundError, NotADirectoryError, ImportError) as err:
        message = describe(err)
        if isinstance(err, ImportError) and not isinstance(err, ModuleNotFoundError):
            message = f"{message} (an optional dependency is missing)"
        cls = MissingPathError if isinstance(err, FileNotFoundError) else UsageError
        raise cls(f"{context}: {message}" if context else message) from err
    except _yaml_error_types() as err:
        raise UsageError(f"{context}: {err}" if context else str(err)) from err


__all__ = [
    "DEBUG_ENV",
    "MissingPathError",
    "UsageError",
    "debug_enabled",
    "describe",
    "is_usage_error",
    "usage_errors",
]
