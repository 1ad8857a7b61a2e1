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

import importlib
import sys
import traceback
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

    def _uninstall(self) -> str:
        if self.distribution == UNKNOWN_DISTRIBUTION:
            return ""
        return f" (pip uninstall {self.distribution.split()[0]})"

    def error(self, problem: str, remedy: str | None = None) -> PluginLoadError:
        """A :class:`PluginLoadError` naming this entry point, its distribution, ``problem`` and what to do
        (``remedy``; by default: fix the entry point in the distribution's ``pyproject.toml``)."""
        remedy = remedy or "Fix the entry point in that distribution's pyproject.toml and reinstall it"
        return PluginLoadError(f"{self.describe()} {problem}. {remedy}, or uninstall it{self._uninstall()}.")

    def load(self) -> Any:
        """The object the entry point names (importing its module); any failure is a :class:`PluginLoadError`
        that says where it happened: the entry point names a module that cannot be found or an attribute the
        module lacks (the entry point is wrong, or the distribution is not installed here), or the plugin's own
        code raised while its module was imported (an error inside the plugin, not in its entry point)."""
        module_name = self.entry_point.module
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and (module_name == err.name or module_name.startswith(f"{err.name}.")):
                raise self.error(
                    f"names the module {module_name!r}, which cannot be found ({err})",
                    "Check the module path of the entry point and that the distribution's package is installed "
                    "in this Python environment (pip install -e <its directory>)",
                ) from err
            raise self._raised_inside(module_name, err) from err
        except Exception as err:
            raise self._raised_inside(module_name, err) from err
        target: Any = module
        for part in (self.entry_point.attr or "").split("."):
            if not part:
                continue
            try:
                target = getattr(target, part)
            except AttributeError as err:
                raise self.error(
                    f"failed to load: AttributeError: module {module_name!r} has no attribute "
                    f"{self.entry_point.attr!r}"
                ) from err
        return target

    def _raised_inside(self, module_name: str, err: BaseException) -> PluginLoadError:
        """The error of a plugin module that was found but raised while it was imported."""
        return self.error(
            f"failed to load: importing its module {module_name!r} raised {type(err).__name__}: {err}"
            f"{_where(err)}. This is an error inside the plugin's code (or a missing dependency of it), not in "
            "reflect-trl or in the entry point",
            f"Fix it in the plugin (distribution '{self.distribution}'; run `python -c \"import {module_name}\"` "
            "to see the traceback)",
        )


def _where(err: BaseException) -> str:
    """`` (at file:line)``: where ``err`` was raised (a SyntaxError: the offending line), or ""."""
    if isinstance(err, SyntaxError) and err.filename:
        return f" (at {err.filename}:{err.lineno})"
    frames = traceback.extract_tb(err.__traceback__)
    own = [f for f in frames if "importlib" not in f.filename and not f.filename.startswith("<frozen")]
    frame = (own or frames or [None])[-1]
    return f" (at {frame.filename}:{frame.lineno})" if frame is not None else ""


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
