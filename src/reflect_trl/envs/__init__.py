"""Environment registry: ``make_env("taxi", horizon=15)``.

Environments are registered by import path so that optional extras (TextWorld, ALFWorld) cost nothing
until they are used.
"""

from __future__ import annotations

import importlib
from typing import Any

from reflect_trl.envs.base import SPLITS, Observation, StepResult, Task, TextEnv, split_seed

# name -> "module:Class"
_REGISTRY: dict[str, str] = {
    "taxi": "reflect_trl.envs.taxi:DangerousTaxiEnv",
    "auto_explore": "reflect_trl.envs.auto_explore:AutoExploreEnv",
    "textworld": "reflect_trl.envs.textworld_env:TextWorldEnv",
    "alfworld": "reflect_trl.envs.alfworld_env:ALFWorldEnv",
}


def register_env(name: str, target: str | type[TextEnv]) -> None:
    """Register an environment class (or its ``"module:Class"`` path) under ``name``."""
    if not isinstance(target, str):
        target = f"{target.__module__}:{target.__qualname__}"
    _REGISTRY[name] = target


def list_envs() -> list[str]:
    return sorted(_REGISTRY)


def get_env_class(name: str) -> type[TextEnv]:
    if name not in _REGISTRY:
        raise KeyError(f"unknown environment {name!r}; known environments: {list_envs()}")
    module_name, _, attr = _REGISTRY[name].partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr)


def make_env(name: str, **kwargs: Any) -> TextEnv:
    """Instantiate the environment registered as ``name`` with its keyword arguments."""
    return get_env_class(name)(**kwargs)


__all__ = [
    "SPLITS",
    "Observation",
    "StepResult",
    "Task",
    "TextEnv",
    "get_env_class",
    "list_envs",
    "make_env",
    "register_env",
    "split_seed",
]
