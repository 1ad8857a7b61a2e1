"""Reflectors (who writes reflections in the data) and the frozen reflection model used in rollouts.

The oracle reflector of an environment comes from, in order of precedence: the built-in table below,
:func:`register_oracle_reflector` calls in the running process, or an installed distribution's entry point in the
group ``reflect_trl.reflectors`` (``<env name> = "module:Class"``, read lazily; a name taken by the first two is
ignored with a warning). An environment without one can still get data from the teacher reflector
(:class:`reflect_trl.reflection.teacher.TeacherReflector`, passed to ``reflect_trl.data.builder.build_datasets``).
"""

from __future__ import annotations

import importlib
from typing import Any

from reflect_trl.envs import did_you_mean
from reflect_trl.envs.entry_points import REFLECTOR_GROUP, Plugin, plugins_without
from reflect_trl.reflection.base import ReflectionContext, Reflector

# env name -> "module:Class" of its oracle reflector (lazy, like the env registry).
_ORACLE_REFLECTORS: dict[str, str] = {
    "taxi": "reflect_trl.reflection.taxi_oracle:TaxiOracleReflector",
    "auto_explore": "reflect_trl.reflection.auto_explore_oracle:AutoExploreOracleReflector",
    "textworld": "reflect_trl.reflection.textgame_oracle:TextGameOracleReflector",
    "alfworld": "reflect_trl.reflection.textgame_oracle:TextGameOracleReflector",
}


def register_oracle_reflector(env_name: str, target: str | type) -> None:
    """Register the oracle reflector class (or its ``"module:Class"`` path) of environment ``env_name``."""
    if not isinstance(target, str):
        target = f"{target.__module__}:{target.__qualname__}"
    _ORACLE_REFLECTORS[env_name] = target


def _entry_point_reflectors() -> dict[str, Plugin]:
    return plugins_without(REFLECTOR_GROUP, _ORACLE_REFLECTORS, "oracle reflector")


def list_oracle_reflectors() -> list[str]:
    """Environment names that have an oracle reflector (built-in, registered or installed)."""
    return sorted(set(_ORACLE_REFLECTORS) | set(_entry_point_reflectors()))


def get_oracle_reflector(env_name: str, **kwargs: Any) -> Reflector:
    """The offline, seeded oracle reflector of an environment.

    Raises ``KeyError`` when the environment has none and
    :class:`~reflect_trl.envs.entry_points.PluginLoadError` (an ``ImportError``) naming the distribution and entry
    point when an installed one fails to load."""
    if env_name in _ORACLE_REFLECTORS:
        module_name, _, attr = _ORACLE_REFLECTORS[env_name].partition(":")
        return getattr(importlib.import_module(module_name), attr)(**kwargs)
    plugin = _entry_point_reflectors().get(env_name)
    if plugin is None:
        raise KeyError(
            f"no oracle reflector for environment {env_name!r}"
            f"{did_you_mean(env_name, list_oracle_reflectors())}; known: {list_oracle_reflectors()}. An installed "
            f"package adds one through the entry-point group '{REFLECTOR_GROUP}'; without one, pass a "
            "reflect_trl.reflection.teacher.TeacherReflector to reflect_trl.data.builder.build_datasets "
            "(docs/custom_environment.md)"
        )
    cls = plugin.load()
    if not callable(cls):
        raise plugin.error(
            f"names {cls!r}, which is not a reflector class",
            "Point the entry point at the reflector class in the distribution's pyproject.toml and reinstall it",
        )
    reflector = cls(**kwargs)
    if not callable(getattr(reflector, "reflect", None)):
        raise plugin.error(
            f"makes a {type(reflector).__name__} without a reflect(ctx, rng) method",
            "Give the class a method reflect(self, ctx, rng) -> str (docs/custom_environment.md)",
        )
    return reflector


__all__ = [
    "ReflectionContext",
    "Reflector",
    "get_oracle_reflector",
    "list_oracle_reflectors",
    "register_oracle_reflector",
]
