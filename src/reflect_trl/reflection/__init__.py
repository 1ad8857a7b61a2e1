"""Reflectors (who writes reflections in the data) and the frozen reflection model used in rollouts."""

from __future__ import annotations

import importlib

from reflect_trl.reflection.base import ReflectionContext, Reflector

# env name -> "module:Class" of its oracle reflector (lazy, like the env registry).
_ORACLE_REFLECTORS: dict[str, str] = {
    "taxi": "reflect_trl.reflection.taxi_oracle:TaxiOracleReflector",
    "auto_explore": "reflect_trl.reflection.auto_explore_oracle:AutoExploreOracleReflector",
    "textworld": "reflect_trl.reflection.textgame_oracle:TextGameOracleReflector",
    "alfworld": "reflect_trl.reflection.textgame_oracle:TextGameOracleReflector",
}


def register_oracle_reflector(env_name: str, target: str) -> None:
    _ORACLE_REFLECTORS[env_name] = target


def get_oracle_reflector(env_name: str, **kwargs) -> Reflector:
    """The offline, seeded oracle reflector of an environment."""
    if env_name not in _ORACLE_REFLECTORS:
        raise KeyError(
            f"no oracle reflector for environment {env_name!r}; known: {sorted(_ORACLE_REFLECTORS)}"
        )
    module_name, _, attr = _ORACLE_REFLECTORS[env_name].partition(":")
    return getattr(importlib.import_module(module_name), attr)(**kwargs)


__all__ = ["ReflectionContext", "Reflector", "get_oracle_reflector", "register_oracle_reflector"]
