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
    ("target", "message"),
    [
        ("no_such_module_xyz:Env", "failed to load: ModuleNotFoundError"),
        ("reflect_lock_puzzle.env:NoSuchClass", "failed to load: AttributeError"),
        ("collections:OrderedDict", "not a subclass of reflect_trl.envs.TextEnv"),
        ("reflect_lock_puzzle.env:LockPuzzleEnv", "whose name is 'lock_puzzle'"),  # registered as 'bad_env'
    ],
)
def test_a_broken_environment_entry_point_is_a_clear_error(tmp_path, on_path, target, message):
    write_distribution(tmp_path, "broken-plugin", {"reflect_trl.envs": {"bad_env": target}}, version="2.0")
    on_path(tmp_path, EXAMPLE_SRC)
    assert "bad_env" in list_envs()  # listed without being imported
    with pytest.raises(PluginLoadError) as info:
        make_env("bad_env")
    text = str(info.value)
    assert f"entry point 'bad_env = {target}' (group 'reflect_trl.envs')" in text
    assert "of distribution 'broken-plugin 2.0'" in text
    assert message in text
    assert "pip uninstall broken-plugin" in text  # what to do
    assert isinstance(info.value, ImportError)  # `reflect-trl envs` lists it as unavailable


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
