"""``reflect-trl init-env NAME``: a package skeleton for a new environment, working from the first minute.

It writes ``reflect-<name>/`` (or ``--output_dir``) from the templates in ``reflect_trl/templates/env``: a
``pyproject.toml`` with both entry points, an environment and an oracle reflector that already keep the whole
contract (a corridor walk; ``reflect-trl check-env NAME`` passes before anything is edited), full-size CPU recipes
and a smoke preset (``recipes/smoke``, ``smoke.sh``: data -> sft -> rl -> eval in about a minute on a CPU),
a contract test and a README. Nothing is installed: ``pip install -e <dir>`` registers it.

``--recipes-only NAME`` writes only the recipes and ``smoke.sh`` (to ``--output_dir``, default this directory) for
an environment written by hand that is already registered as NAME (an entry point, a built-in) or importable as
``module:Class``; it refuses to overwrite a file that exists.
"""

from __future__ import annotations

import argparse
import keyword
import re
from collections.abc import Sequence
from pathlib import Path

TEMPLATE_DIR = Path(__file__).resolve().parents[1] / "templates" / "env"
NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*")
DESCRIPTION = (
    "Write a package skeleton for a new environment NAME: pyproject.toml with the entry points, an environment and "
    "an oracle reflector that already pass `reflect-trl check-env NAME` (a corridor walk, to be replaced), "
    "recipes for the tiny CPU models, a smoke preset (recipes/smoke, smoke.sh: data -> sft -> rl -> eval in about "
    "a minute on a CPU), a contract test and a README. --recipes-only: only the recipes and smoke.sh, for an "
    "environment you wrote by hand."
)


def placeholders(name: str) -> dict[str, str]:
    """The values of the templates' ``{{...}}`` placeholders for environment ``name``."""
    words = name.split("_")
    return {
        "name": name,
        "Class": "".join(w.capitalize() for w in words if w),
        "Title": " ".join(w.capitalize() for w in words if w),
        "package": f"reflect_{name}",
        "dist": f"reflect-{name.replace('_', '-')}",
    }


def check_name(name: str) -> None:
    """A new environment name: lowercase letters, digits and underscores, a Python identifier, not taken."""
    from reflect_trl.envs import list_envs
    from reflect_trl.errors import UsageError

    if not NAME_PATTERN.fullmatch(name) or keyword.iskeyword(name):
        raise UsageError(
            f"NAME {name!r}: an environment name is lowercase letters, digits and underscores, starting with a "
            "letter (it names the package reflect_<name> and the recipes' env_name), e.g. corridor or key_door"
        )
    if name in list_envs():
        raise UsageError(f"NAME {name!r} is taken by an environment already registered (`reflect-trl envs`)")


def render(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def scaffold_files(name: str) -> dict[str, str]:
    """``{relative path: text}`` of the skeleton of environment ``name``."""
    values = placeholders(name)
    files = {}
    for template in sorted(TEMPLATE_DIR.rglob("*.tmpl")):
        relative = template.relative_to(TEMPLATE_DIR).as_posix().removesuffix(".tmpl")
        relative = relative.replace("__package__", values["package"])
        files[relative] = render(template.read_text(encoding="utf-8"), values)
    return files


def is_recipe(relative: str) -> bool:
    """Whether a file of the skeleton belongs to ``--recipes-only``: the recipes and ``smoke.sh``."""
    return relative.startswith("recipes/") or relative == "smoke.sh"


def resolve_env(target: str) -> tuple[str, type, bool]:
    """``(name, class, registered)`` of an existing environment: a registered name, or ``module:Class`` (its ``name``
    attribute; ``registered`` says whether that name finds it)."""
    import importlib

    from reflect_trl.envs import TextEnv, get_env_class, list_envs
    from reflect_trl.errors import UsageError, describe

    if ":" not in target:
        try:
            cls = get_env_class(target)
        except KeyError as err:
            raise UsageError(
                f"NAME: {describe(err)}; --recipes-only needs an environment that exists (register it, or pass "
                "module:Class)"
            ) from err
        except ImportError as err:
            raise UsageError(f"NAME {target!r} cannot be imported: {describe(err)}") from err
        return target, cls, True
    module_name, _, qualname = target.partition(":")
    try:
        found: object = importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as err:
        raise UsageError(f"NAME {target!r} cannot be imported: {describe(err)}") from err
    if not (isinstance(found, type) and issubclass(found, TextEnv)):
        raise UsageError(f"NAME {target!r} is {found!r}, not a subclass of reflect_trl.envs.TextEnv")
    if not found.name:
        raise UsageError(f"NAME {target!r}: the class sets no `name` (the recipes' env_name)")
    registered = False
    if found.name in list_envs():
        try:
            registered = get_env_class(found.name) is found
        except Exception:
            registered = False
    return found.name, found, registered


def init_recipes(target: str, output_dir: str | Path | None = None) -> tuple[Path, list[str]]:
    """Write the recipes and ``smoke.sh`` of an existing environment ``target`` (a registered name or
    ``module:Class``) to ``output_dir`` (default: this directory); returns it and the files written.

    Raises :class:`~reflect_trl.errors.UsageError` for an environment that cannot be found and when any of the files
    exists (nothing is written then)."""
    from reflect_trl.errors import UsageError

    name, _, _ = resolve_env(target)
    root = Path(output_dir or ".")
    files = {path: text for path, text in scaffold_files(name).items() if is_recipe(path)}
    existing = [path for path in files if (root / path).exists()]
    if existing:
        raise UsageError(
            f"--recipes-only: {len(existing)} of the {len(files)} files exist already in {str(root)!r} ("
            f"{', '.join(existing)}); nothing was written: move them away or choose another --output_dir"
        )
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if path.suffix == ".sh":
            path.chmod(0o755)
    return root, list(files)


def init_env(name: str, output_dir: str | Path | None = None) -> Path:
    """Write the skeleton of environment ``name`` to ``output_dir`` (default ``reflect-<name>``); returns it.

    Raises :class:`~reflect_trl.errors.UsageError` for a bad or taken name and for an output directory that
    exists and is not empty (nothing is overwritten)."""
    from reflect_trl.errors import UsageError

    check_name(name)
    root = Path(output_dir or placeholders(name)["dist"])
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise UsageError(f"--output_dir {str(root)!r} exists and is not empty; choose another directory")
    for relative, text in scaffold_files(name).items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if path.suffix == ".sh":
            path.chmod(0o755)
    return root


def init_env_cli(argv: Sequence[str] | None = None) -> Path:
    """``reflect-trl init-env corridor [--output_dir reflect-corridor]``; ``reflect-trl init-env --recipes-only
    my_env`` (recipes and smoke.sh of an existing environment)."""
    parser = argparse.ArgumentParser(prog="reflect-trl init-env", description=DESCRIPTION)
    parser.add_argument(
        "name",
        metavar="NAME",
        help="the environment's name, e.g. corridor (lowercase, _); with --recipes-only an existing environment: a "
        "registered name or module:Class",
    )
    parser.add_argument(
        "--output_dir",
        default=None,
        help="where the package goes (default: reflect-<NAME> in this directory; --recipes-only: this directory)",
    )
    parser.add_argument(
        "--recipes-only",
        "--recipes_only",
        dest="recipes_only",
        action="store_true",
        help="write only recipes/ (full size and smoke) and smoke.sh for an environment written by hand, without the "
        "package skeleton; refuses to overwrite existing files",
    )
    args = parser.parse_args(argv)
    if args.recipes_only:
        root, written = init_recipes(args.name, args.output_dir)
        name, _, registered = resolve_env(args.name)
        print(
            f"wrote {len(written)} files for environment {name!r} to {root}/: recipes/, recipes/smoke/, smoke.sh"
        )
        if not registered:
            print(
                f"note: reflect-trl commands find an environment by name: register {name!r} (an entry point in the "
                "group reflect_trl.envs, docs/custom_environment.md section 2) before running smoke.sh"
            )
        print(f"next:  cd {root} && reflect-trl check-env {name} && bash smoke.sh")
        return root
    root = init_env(args.name, args.output_dir)
    values = placeholders(args.name)
    print(f"wrote the package {values['dist']} of environment {args.name!r} to {root}/")
    print(f"next:  cd {root} && pip install -e . && reflect-trl check-env {args.name} && bash smoke.sh")
    print(
        f"then:  replace the game in src/{values['package']}/env.py (README.md, docs/custom_environment.md)"
    )
    return root


__all__ = [
    "check_name",
    "init_env",
    "init_env_cli",
    "init_recipes",
    "is_recipe",
    "placeholders",
    "resolve_env",
    "scaffold_files",
]
