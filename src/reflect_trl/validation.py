"""Up-front checks of a command's input, run before anything is written.

Each check raises :class:`~reflect_trl.errors.UsageError` (exit status 2) with a message that names the setting, the
value and what to do. :func:`removed_on_failure` removes an output directory that a failed setup created.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reflect_trl.errors import MissingPathError, UsageError, describe

#: Files that make a directory a loadable model (a full model or a PEFT adapter).
MODEL_FILES = ("config.json", "adapter_config.json")


def looks_like_local_path(ref: str) -> bool:
    """True when ``ref`` can only mean a local path: it starts with ``.``, ``/`` or ``~``, has a backslash or more
    than one ``/``, ends with ``/``, or is ``dir/name`` with an existing ``dir``. A hub id is ``name`` or
    ``org/name``."""
    if ref.startswith((".", "/", "~")) or "\\" in ref or ref.endswith("/") or ref.count("/") > 1:
        return True
    return ref.count("/") == 1 and Path(ref.split("/")[0]).is_dir()


def check_model_path(ref: str | None, what: str) -> None:
    """A model setting names a loadable local directory, or something that can only be a hub id.

    ``what`` names the setting in the message (``"model_name_or_path"``, ``"configuration 'RL': policy"``)."""
    if not ref:
        return
    path = Path(ref).expanduser()
    if path.is_dir():
        if not any((path / name).is_file() for name in MODEL_FILES):
            raise UsageError(
                f"{what} {ref!r} is a directory but not a saved model (it has no {' or '.join(MODEL_FILES)}); "
                "give the output_dir of a finished `reflect-trl sft`/`rl` run, a `reflect-trl build-tiny` directory "
                "or a hub id"
            )
        return
    if path.exists():
        raise UsageError(f"{what} {ref!r} is a file; a model is a directory (or a hub id 'org/name')")
    if looks_like_local_path(ref):
        raise MissingPathError(
            f"{what} {ref!r} does not exist (a local directory; train it first, or give a hub id 'org/name')"
        )


def check_env(
    env_name: str,
    env_kwargs: Mapping[str, Any] | None = None,
    stages: Sequence[str] | None = None,
    what: str = "env_name",
):
    """Build the environment once (unknown name, bad ``env_kwargs``, unknown stages fail here); returns it."""
    from reflect_trl.envs import EXTRAS, PluginLoadError, get_env_class

    try:
        cls = get_env_class(env_name)
    except KeyError as err:
        raise UsageError(f"{what}: {describe(err)}") from err
    except PluginLoadError as err:  # an installed plugin: its message says what failed and where
        raise UsageError(f"{what} {env_name!r}: the plugin could not be loaded: {describe(err)}") from err
    except ImportError as err:
        extra = EXTRAS.get(env_name)
        hint = (
            f" (install the extra: pip install 'reflect-trl[{extra}]')"
            if extra and "pip install" not in str(err)
            else ""
        )
        raise UsageError(f"{what} {env_name!r} cannot be imported: {describe(err)}{hint}") from err
    kwargs = dict(env_kwargs or {})
    try:
        env = cls(**kwargs)
    except TypeError as err:
        if "argument" not in str(err):
            raise
        raise UsageError(
            f"env_kwargs {kwargs}: not accepted by environment {env_name!r} ({describe(err)})"
        ) from err
    except (ValueError, KeyError, FileNotFoundError) as err:
        raise UsageError(f"env_kwargs {kwargs} of environment {env_name!r}: {describe(err)}") from err
    except ImportError as err:  # an optional dependency imported when the environment is made
        raise UsageError(f"{what} {env_name!r} cannot be made: {describe(err)}") from err
    for stage in stages or ():
        if stage not in env.stages:
            raise UsageError(f"{env_name}: unknown stage {stage!r}; the stages are {list(env.stages)}")
    return env


def check_label_tokens(tokenizer, labels: Sequence[str], what: str) -> None:
    """Every option label is one distinct token of the tokenizer after the action cue."""
    from reflect_trl.prompts import label_token_ids

    try:
        label_token_ids(tokenizer, labels)
    except ValueError as err:
        raise UsageError(f"{what}: {describe(err)}") from err


def check_reflection_server(base_url: str | None, model_name: str | None, **settings: Any) -> None:
    """The settings of an OpenAI-compatible reflection server are usable (URL form, model name, timeouts, retries,
    concurrency); nothing is sent to the server."""
    from reflect_trl.reflection.player import make_reflection_player

    try:
        make_reflection_player("openai", base_url=base_url, model_name=model_name, **settings)
    except ValueError as err:
        raise UsageError(f"reflection server settings: {describe(err)}") from err


def first_missing_ancestor(path: str | Path) -> Path | None:
    """The outermost directory of ``path`` (``path`` itself included) that does not exist yet, or None."""
    current, missing = Path(path).expanduser().absolute(), None
    while not current.exists():
        missing = current
        if current.parent == current:
            break
        current = current.parent
    return missing


@contextmanager
def removed_on_failure(path: str | Path | None) -> Iterator[None]:
    """If the block fails, remove the directories of ``path`` that did not exist when it started (so a failed setup
    leaves no output directory behind; a directory that existed before is never touched)."""
    created = first_missing_ancestor(path) if path is not None else None
    try:
        yield
    except BaseException:
        if created is not None and created.exists():
            shutil.rmtree(created, ignore_errors=True)
        raise


__all__ = [
    "MODEL_FILES",
    "check_env",
    "check_label_tokens",
    "check_model_path",
    "check_reflection_server",
    "first_missing_ancestor",
    "looks_like_local_path",
    "removed_on_failure",
]
