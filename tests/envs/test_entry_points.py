"""Environments and oracle reflectors from other distributions, found through entry points.

Nothing is pip-installed: each test writes a ``*.dist-info`` (``METADATA`` + ``entry_points.txt``) into a temporary
directory and puts it on ``sys.path`` (in-process) or ``PYTHONPATH`` (the real CLI in a subprocess).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import reflect_trl.envs
import reflect_trl.reflection
from _plugins import EXAMPLE_SRC, example_entry_points, write_distribution
from reflect_trl.envs import PluginLoadError, get_env_class, list_envs, make_env
from reflect_trl.envs import entry_points as plugins
from reflect_trl.reflection import get_oracle_reflector, list_oracle_reflectors


def run_cli(*args: str, path: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, path), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "reflect_trl.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.fixture
def on_path(monkeypatch):
    """Put directories on ``sys.path`` for this test; warnings already given in this process are forgotten."""
    monkeypatch.setattr(plugins, "_WARNED", set())

    def add(*dirs) -> None:
        for d in reversed(dirs):
            monkeypatch.syspath_prepend(str(d))

    return add


def test_cli_envs_lists_an_entry_point_environment(tmp_path):
    write_distribution(tmp_path, "reflect-lock-puzzle", example_entry_points())
    done = run_cli("envs", path=[tmp_path, EXAMPLE_SRC])
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines()}
    assert lines["lock_puzzle"].split(None, 1)[1] == "one_dial, two_dials, three_dials"
    assert "taxi" in lines  # the built-ins are still there


def test_cli_envs_names_the_distribution_of_a_broken_entry_point(tmp_path):
    write_distribution(
        tmp_path, "broken-plugin", {"reflect_trl.envs": {"broken_env": "no_such_module_xyz:Env"}}
    )
    done = run_cli("envs", path=[tmp_path])
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("broken_env ")]
    assert "unavailable" in line
    assert "entry point 'broken_env = no_such_module_xyz:Env'" in line
    assert "distribution 'broken-plugin 0.1.0'" in line
    assert "No module named 'no_such_module_xyz'" in line
    assert "Traceback" not in done.stdout + done.stderr
    assert "taxi " in done.stdout  # one broken plugin does not hide the others


def test_entry_point_environment_and_reflector_load_in_process(tmp_path, on_path):
    assert "lock_puzzle" not in reflect_trl.envs._REGISTRY  # nothing in reflect-trl names it
    write_distribution(tmp_path, "reflect-lock-puzzle", example_entry_points())
    on_path(tmp_path, EXAMPLE_SRC)
    assert "lock_puzzle" in list_envs()
    assert "lock_puzzle" in list_oracle_reflectors()
    env = make_env("lock_puzzle", horizon=12)
    assert type(env).__module__ == "reflect_lock_puzzle.env" and env.horizon == 12
    reflector = get_oracle_reflector("lock_puzzle")
    assert type(reflector).__name__ == "LockPuzzleOracleReflector"


def test_discovery_follows_sys_path(tmp_path, on_path):
    assert "lock_puzzle_cached" not in list_envs()  # fills the cache for the current sys.path
    write_distribution(tmp_path, "late-plugin", {"reflect_trl.envs": {"lock_puzzle_cached": "m:C"}})
    on_path(tmp_path)
    assert "lock_puzzle_cached" in list_envs()


@pytest.mark.parametrize(
    ("target", "message", "remedy"),
    [
        (
            "no_such_module_xyz:Env",
            "names the module 'no_such_module_xyz', which cannot be found",
            "module path",
        ),
        ("reflect_lock_puzzle.env:NoSuchClass", "has no attribute 'NoSuchClass'", "Fix the entry point"),
        ("collections:OrderedDict", "not a subclass of reflect_trl.envs.TextEnv", "Point the entry point"),
        # registered as 'bad_env', the class says 'lock_puzzle': either side can change
        (
            "reflect_lock_puzzle.env:LockPuzzleEnv",
            "whose `name` attribute is 'lock_puzzle'",
            "Set `name = 'bad_env'`",
        ),
    ],
)
def test_a_broken_environment_entry_point_is_a_clear_error(tmp_path, on_path, target, message, remedy):
    write_distribution(tmp_path, "broken-plugin", {"reflect_trl.envs": {"bad_env": target}}, version="2.0")
    on_path(tmp_path, EXAMPLE_SRC)
    assert "bad_env" in list_envs()  # listed without being imported
    with pytest.raises(PluginLoadError) as info:
        make_env("bad_env")
    text = str(info.value)
    assert f"entry point 'bad_env = {target}' (group 'reflect_trl.envs')" in text
    assert "of distribution 'broken-plugin 2.0'" in text
    assert message in text and remedy in text
    assert "pip uninstall broken-plugin" in text  # what to do
    assert "install the extra" not in text and "reflect-trl[" not in text
    assert isinstance(info.value, ImportError)  # `reflect-trl envs` lists it as unavailable


def write_plugin_package(root, body: str, package: str):
    """A plugin package whose ``env`` module has ``body`` as its code."""
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    (root / package / "env.py").write_text(body)
    return root


@pytest.mark.parametrize(
    ("body", "raised"),
    [
        ("import missing_dependency_xyz\n", "ModuleNotFoundError: No module named 'missing_dependency_xyz'"),
        ("x = 1\nraise RuntimeError('boom in the plugin')\n", "RuntimeError: boom in the plugin"),
        ("def broken(:\n", "SyntaxError"),
    ],
)
def test_an_error_inside_a_plugin_is_named_as_such(tmp_path, on_path, body, raised):
    package = (
        f"corridor_plugin_{tmp_path.name.replace('-', '_')}"  # a fresh package (sys.modules keeps packages)
    )
    write_plugin_package(tmp_path / "src", body, package)
    write_distribution(
        tmp_path / "site", "corridor-plugin", {"reflect_trl.envs": {"corridor": f"{package}.env:Env"}}
    )
    on_path(tmp_path / "site", tmp_path / "src")
    with pytest.raises(PluginLoadError) as info:
        get_env_class("corridor")
    text = str(info.value)
    assert f"importing its module '{package}.env' raised {raised}" in text
    assert f"{package}/env.py:" in text  # where
    assert "an error inside the plugin's code" in text and "not in reflect-trl or in the entry point" in text
    assert "Fix the entry point" not in text and "install the extra" not in text


def test_the_cli_reports_a_broken_plugin_without_blaming_extras_or_entry_points(tmp_path, on_path):
    from reflect_trl.errors import UsageError
    from reflect_trl.validation import check_env

    write_plugin_package(tmp_path / "src", "import missing_dependency_xyz\n", "corridor_plugin_cli")
    write_distribution(
        tmp_path / "site",
        "corridor-plugin",
        {"reflect_trl.envs": {"corridor": "corridor_plugin_cli.env:Env"}},
    )
    on_path(tmp_path / "site", tmp_path / "src")
    with pytest.raises(UsageError) as info:
        check_env("corridor")
    text = str(info.value)
    assert text.startswith("env_name 'corridor': the plugin could not be loaded: entry point 'corridor = ")
    assert "missing_dependency_xyz" in text and "inside the plugin" in text
    assert "install the extra" not in text and "reflect-trl[corridor]" not in text


def test_misspelled_environment_names_get_a_suggestion(tmp_path, on_path):
    from reflect_trl.errors import UsageError
    from reflect_trl.validation import check_env

    with pytest.raises(KeyError, match=r"unknown environment 'taxy' \(did you mean 'taxi'\?\)"):
        get_env_class("taxy")
    write_distribution(tmp_path, "reflect-lock-puzzle", example_entry_points())
    on_path(tmp_path, EXAMPLE_SRC)
    with pytest.raises(
        UsageError, match=r"env_name: unknown environment 'lock_puzle' \(did you mean 'lock_puzzle'\?\)"
    ):
        check_env("lock_puzle")
    with pytest.raises(KeyError, match=r"did you mean 'lock_puzzle'\?"):
        get_oracle_reflector("lock_puzle")
    with pytest.raises(KeyError) as info:
        get_env_class("zzzzzz")
    assert "did you mean" not in str(info.value)


def test_env_distribution_names_the_plugin(tmp_path, on_path):
    from reflect_trl.envs import env_distribution

    write_distribution(tmp_path, "reflect-lock-puzzle", example_entry_points(), version="0.3.1")
    on_path(tmp_path, EXAMPLE_SRC)
    assert env_distribution("lock_puzzle") == "reflect-lock-puzzle 0.3.1"
    assert env_distribution("taxi") is None and env_distribution("no_such_env_xyz") is None


def test_a_broken_reflector_entry_point_is_a_clear_error(tmp_path, on_path):
    write_distribution(
        tmp_path, "broken-plugin", {"reflect_trl.reflectors": {"bad_env": "no_such_module_xyz:R"}}
    )
    on_path(tmp_path)
    with pytest.raises(
        PluginLoadError, match=r"'bad_env = no_such_module_xyz:R' \(group 'reflect_trl.reflectors'\)"
    ):
        get_oracle_reflector("bad_env")


def test_unknown_names_point_to_the_entry_point_groups():
    with pytest.raises(KeyError, match="entry-point group 'reflect_trl.envs'"):
        get_env_class("no_such_env_xyz")
    with pytest.raises(KeyError, match="'reflect_trl.reflectors'.*TeacherReflector"):
        get_oracle_reflector("no_such_env_xyz")


def test_built_ins_take_precedence_with_a_warning(tmp_path, on_path):
    from reflect_trl.envs.taxi import DangerousTaxiEnv
    from reflect_trl.reflection.taxi_oracle import TaxiOracleReflector

    write_distribution(
        tmp_path,
        "shadowing-plugin",
        {
            "reflect_trl.envs": {"taxi": "reflect_lock_puzzle.env:LockPuzzleEnv"},
            "reflect_trl.reflectors": {"taxi": "reflect_lock_puzzle.reflector:LockPuzzleOracleReflector"},
        },
    )
    on_path(tmp_path, EXAMPLE_SRC)
    with pytest.warns(
        UserWarning, match=r"'taxi = reflect_lock_puzzle.env:LockPuzzleEnv'.*shadowing-plugin 0.1.0"
    ):
        assert list_envs().count("taxi") == 1
    assert get_env_class("taxi") is DangerousTaxiEnv
    with pytest.warns(UserWarning, match="'reflect_trl.reflectors'.*takes precedence"):
        assert "taxi" in list_oracle_reflectors()
    assert isinstance(get_oracle_reflector("taxi"), TaxiOracleReflector)


def test_in_process_registration_takes_precedence(tmp_path, on_path, monkeypatch):
    from _toy_env import LineWorldEnv

    write_distribution(
        tmp_path, "some-plugin", {"reflect_trl.envs": {"line_world": "collections:OrderedDict"}}
    )
    on_path(tmp_path)
    monkeypatch.setitem(reflect_trl.envs._REGISTRY, "line_world", "_toy_env:LineWorldEnv")
    with pytest.warns(UserWarning, match="some-plugin"):
        list_envs()
    assert get_env_class("line_world") is LineWorldEnv


def test_two_distributions_claiming_one_name(tmp_path, on_path):
    first, second = tmp_path / "first", tmp_path / "second"
    write_distribution(
        first, "first-plugin", {"reflect_trl.envs": {"lock_puzzle": "reflect_lock_puzzle.env:LockPuzzleEnv"}}
    )
    write_distribution(
        second, "second-plugin", {"reflect_trl.envs": {"lock_puzzle": "collections:OrderedDict"}}
    )
    on_path(first, second, EXAMPLE_SRC)
    with pytest.warns(UserWarning, match="second-plugin.*first-plugin"):
        assert get_env_class("lock_puzzle").__name__ == "LockPuzzleEnv"
