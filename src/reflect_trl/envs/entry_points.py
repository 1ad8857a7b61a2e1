"""Plugins through Python entry points: environments and oracle reflectors that other distributions provide.

A distribution declares, in its ``pyproject.toml``::

    [project.entry-points."reflect_trl.envs"]
    lock_puzzle = "reflect_lock_puzzle.env:LockPuzzleEnv"

    [project.entry-points."reflect_trl.reflectors"]
    lock_puzzle = "reflect_lock_puzzle.reflector:LockPuzzleOracleReflector"

and ``pip install`` makes ``lock_puzzle`` known to :func:`reflect_trl.envs.make_env`,
:func:`reflect_trl.reflection.get_oracle_reflector` and ``reflect-trl envs``. Discovery is lazy (nothing is
imported until a plugin is used) and reads the installed metadata again whenever ``sys.path`` changes. A plugin
that fails to load raises :class:`PluginLoadError` naming the distribution and the entry point.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

ENV_GROUP = "reflect_trl.envs"
REFLECTOR_GROUP = "reflect_trl.reflectors"
UNKNOWN_DISTRIBUTION = "an unknown distribution"


class PluginLoadError(ImportError):
    """An entry point could not be loaded or does not provide what its group promises."""


@dataclass(frozen=True)
class Plugin:
    """One entry point of a plugin group: ``name = "module:attr"`` declared by ``distribution``."""

    group: str
    name: str
    value: str
    distribution: str  # "name version", or UNKNOWN_DISTRIBUTION
    entry_point: EntryPoint

    def describe(self) -> str:
        return f"entry point '{self.name} = {self.value}' (group '{self.group}') of distribution '{self.distribution}'"

    def error(self, problem: str) -> PluginLoadError:
        """A :class:`PluginLoadError` naming this entry point, its distribution, ``problem`` and what to do."""
        remedy = "Fix the entry point in that distribution's pyproject.toml and reinstall it, or uninstall it"
        if self.distribution != UNKNOWN_DISTRIBUTION:
            remedy += f" (pip uninstall {self.distribution.split()[0]})"
        return PluginLoadError(f"{self.describe()} {problem}. {remedy}.")

    def load(self) -> Any:
        """The object the entry point names (importing its module); any failure is a :class:`PluginLoadError`."""
        try:
            return self.entry_point.load()
        except Exception as err:
            raise self.error(f"failed to load: {type(err).__name__}: {err}") from err


def _distribution(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return UNKNOWN_DISTRIBUTION
    return f"{dist.metadata['Name'] or dist.name} {dist.version}"


# group -> (the sys.path it was read with, its plugins)
_CACHE: dict[str, tuple[tuple[str, ...], dict[str, Plugin]]] = {}
_WARNED: set[tuple[str, ...]] = set()


def _warn_once(key: tuple[str, ...], message: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, UserWarning, stacklevel=3)


def discover(group: str) -> dict[str, Plugin]:
    """``{name: Plugin}`` of the installed entry points of ``group`` (cached per ``sys.path``).

    When two distributions declare one name with different targets, the first one found wins, with a warning."""
    path = tuple(sys.path)
    cached = _CACHE.get(group)
    if cached is None or cached[0] != path:
        found: dict[str, Plugin] = {}
        for ep in entry_points(group=group):
            plugin = Plugin(group, ep.name, ep.value, _distribution(ep), ep)
            kept = found.setdefault(ep.name, plugin)
            if kept is not plugin and kept.value != plugin.value:
                _warn_once(
                    (group, ep.name, plugin.distribution),
                    f"{plugin.describe()} is ignored: {kept.describe()} already claims the name {ep.name!r}",
                )
        cached = _CACHE[group] = (path, found)
    return cached[1]


def plugins_without(group: str, taken: Mapping[str, str], what: str) -> dict[str, Plugin]:
    """The plugins of ``group`` whose names are not ``taken`` by a built-in or in-process registration
    (``{name: "module:Class"}``); a clash is reported with a warning (once per process) and the plugin ignored."""
    out = {}
    for name, plugin in discover(group).items():
        if name not in taken:
            out[name] = plugin
        elif taken[name] != plugin.value:
            _warn_once(
                (group, name, plugin.distribution),
                f"{plugin.describe()} is ignored: the name {name!r} belongs to the {what} {taken[name]} "
                "(built-in or registered in this process), which takes precedence",
            )
    return out


__all__ = ["ENV_GROUP", "REFLECTOR_GROUP", "Plugin", "PluginLoadError", "discover", "plugins_without"]
