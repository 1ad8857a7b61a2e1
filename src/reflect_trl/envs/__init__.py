"""Environment registry: ``make_env("taxi", horizon=15)``.

Environments are registered by import path so that optional extras (TextWorld, ALFWorld) cost nothing
until they are used. Three sources, in order of precedence:

1. the built-in environments below;
2. :func:`register_env` calls in the running process;
3. installed distributions that declare an entry point in the group ``reflect_trl.envs``
   (``name = "module:Class"``, see :mod:`reflect_trl.envs.entry_points` and ``docs/custom_environment.md``),
   read lazily. A name taken by 1. or 2. is ignored with a warning.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any

from reflect_trl.envs.base import (
    SPLITS,
    Observation,
    OracleUnavailableError,
    StepResult,
    Task,
    TextEnv,
    split_seed,
)
from reflect_trl.envs.entry_points import (
    ENV_GROUP,
    UNKNOWN_DISTRIBUTION,
    Plugin,
    PluginLoadError,
    plugins_without,
)

# name -> "module:Class"
_REGISTRY: dict[str, str] = {
    "taxi": "reflect_trl.envs.taxi:DangerousTaxiEnv",
    "auto_explore": "reflect_trl.envs.auto_explore:AutoExploreEnv",
    "textworld": "reflect_trl.envs.textworld_env:TextWorldEnv",
    "alfworld": "reflect_trl.envs.alfworld_env:ALFWorldEnv",
}
#: Built-in environments that need an optional extra of reflect-trl (``pip install 'reflect-trl[<extra>]'``).
EXTRAS: dict[str, str] = {"textworld": "textworld", "alfworld": "alfworld"}


def register_env(name: str, target: str | type[TextEnv]) -> None:
    """Register an environment class (or its ``"module:Class"`` path) under ``name``."""
    if not isinstance(target, str):
        target = f"{target.__module__}:{target.__qualname__}"
    _REGISTRY[name] = target


def _entry_point_envs() -> dict[str, Plugin]:
    """Installed ``reflect_trl.envs`` entry points whose names are not registered otherwise."""
    return plugins_without(ENV_GROUP, _REGISTRY, "environment")


def list_envs() -> list[str]:
    """Names of the built-in, registered and installed (entry point) environments."""
    return sorted(set(_REGISTRY) | set(_entry_point_envs()))


def get_env_class(name: str) -> type[TextEnv]:
    """The environment class registered as ``name`` (importing its module now).

    Raises ``KeyError`` for an unknown name and :class:`~reflect_trl.envs.entry_points.PluginLoadError` (an
    ``ImportError``) naming the distribution and entry point when an installed environment fails to load."""
    if name in _REGISTRY:
        module_name, _, attr = _REGISTRY[name].partition(":")
        module = importlib.import_module(module_name)
        return getattr(module, attr)
    plugin = _entry_point_envs().get(name)
    if plugin is None:
        raise KeyError(
            f"unknown environment {name!r}{did_you_mean(name, list_envs())}; known environments: {list_envs()} (an "
            f"installed package adds one through the entry-point group '{ENV_GROUP}', see docs/custom_environment.md)"
        )
    cls = plugin.load()
    if not (isinstance(cls, type) and issubclass(cls, TextEnv)):
        raise plugin.error(
            f"names {cls!r}, which is not a subclass of reflect_trl.envs.TextEnv",
            "Point the entry point at the environment class (a TextEnv subclass) in the distribution's "
            "pyproject.toml and reinstall it",
        )
    if cls.name != name:
        raise plugin.error(
            f"loads {cls.__module__}.{cls.__qualname__}, whose `name` attribute is {cls.name!r}: the entry point's "
            "name and the class's `name` must be equal (tasks and data record it)",
            f"Set `name = {name!r}` on the class, or rename the entry point to {cls.name!r} in the distribution's "
            "pyproject.toml and reinstall it",
        )
    return cls


def env_distribution(name: str) -> str | None:
    """The installed distribution (``"name version"``) whose entry point provides environment ``name``; None for a
    built-in, an in-process registration or an unknown name."""
    if name in _REGISTRY:
        return None
    plugin = _entry_point_envs().get(name)
    if plugin is None or plugin.distribution == UNKNOWN_DISTRIBUTION:
        return None
    return plugin.distribution


def did_you_mean(name: str, known: list[str]) -> str:
    """`` (did you mean 'x'?)`` for a close match of ``name`` among ``known``, else ``""``."""
    close = difflib.get_close_matches(name, known, n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


def make_env(name: str, **kwargs: Any) -> TextEnv:
    """Instantiate the environment registered as ``name`` with its keyword arguments."""
    return get_env_class(name)(**kwargs)


__all__ = [
    "SPLITS",
    "Observation",
    "OracleUnavailableError",
    "EXTRAS",
    "PluginLoadError",
    "StepResult",
    "Task",
    "TextEnv",
    "did_you_mean",
    "env_distribution",
    "get_env_class",
    "list_envs",
    "make_env",
    "register_env",
    "split_seed",
]
