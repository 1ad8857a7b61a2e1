"""``reflect-trl init-env``: a fresh environment package that keeps the contract and runs its smoke preset end to
end (data -> sft -> rl -> eval) through the real command dispatch, registered by its own entry points."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from _plugins import write_distribution
from reflect_trl.cli import main as reflect_trl
from reflect_trl.cli.init_env import init_env, init_recipes, scaffold_files
from reflect_trl.envs import entry_points
from reflect_trl.envs.check import check_env_contract
from reflect_trl.errors import UsageError

NAME = "nc_corridor"


@pytest.fixture
def scaffolded(tmp_path, monkeypatch):
    """A new package written by `reflect-trl init-env`, installed the way pip would (its entry points on sys.path)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert reflect_trl(["init-env", NAME]) == 0
    root = work / "reflect-nc-corridor"
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    write_distribution(tmp_path / "site", project["name"], project["entry-points"])
    monkeypatch.syspath_prepend(str(root / "src"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(entry_points, "_WARNED", set())
    return root


def test_the_skeleton_is_complete_and_lint_clean(tmp_path):
    files = scaffold_files("key_door")
    assert set(files) >= {
        "pyproject.toml", "README.md", "smoke.sh", "tests/test_env.py",
        "src/reflect_key_door/__init__.py", "src/reflect_key_door/env.py", "src/reflect_key_door/reflector.py",
        *(f"recipes/{n}.yaml" for n in ("data", "sft_reflection", "sft_policy", "sft_plain", "rl", "eval")),
        *(f"recipes/smoke/{n}.yaml" for n in ("data", "sft_reflection", "sft_policy", "rl", "eval")),
    }  # fmt: skip
    assert not [path for path, text in files.items() if "{{" in text or "}}" in text.replace("}}}", "")]
    project = tomllib.loads(files["pyproject.toml"])["project"]
    assert project["name"] == "reflect-key-door"
    assert project["entry-points"] == {
        "reflect_trl.envs": {"key_door": "reflect_key_door.env:KeyDoorEnv"},
        "reflect_trl.reflectors": {"key_door": "reflect_key_door.reflector:KeyDoorOracleReflector"},
    }
    for path, text in files.items():
        if path.endswith(".yaml"):
            assert yaml.safe_load(text)["env_name"] == "key_door", path
    root = init_env("key_door", tmp_path / "pkg")
    assert (root / "smoke.sh").stat().st_mode & 0o111
    ruff = Path(sys.executable).with_name("ruff")
    if ruff.exists():
        done = subprocess.run([str(ruff), "check", str(root)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout
        done = subprocess.run([str(ruff), "format", "--check", str(root)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout


def test_bad_names_and_taken_directories_are_refused(tmp_path):
    for name, words in [("Corridor", "lowercase"), ("2d", "starting with a letter"), ("taxi", "taken")]:
        with pytest.raises(UsageError, match=words):
            init_env(name, tmp_path / "x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(UsageError, match="exists and is not empty"):
        init_env("corridor_two", tmp_path / "full")
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]


def test_a_fresh_environment_passes_check_env(scaffolded, capsys):
    capsys.readouterr()
    assert reflect_trl(["check-env", NAME, "--strict", "--tasks", "10"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert all(line.startswith("PASS") for line in out[:-1]), out
    assert out[-1] == f"{NAME}: 16 checks, 0 failed, 0 warnings, 0 skipped: the contract holds"
    from reflect_nc_corridor.env import NcCorridorEnv

    check_env_contract(NcCorridorEnv, n_tasks=10).raise_for_failures(
        strict=True
    )  # its reflector by entry point
    namespace: dict = {}
    exec((scaffolded / "tests" / "test_env.py").read_text(), namespace)  # the package's own contract test
    namespace["test_the_environment_keeps_the_reflect_trl_contract"]()


SMALLER = {  # the smoke preset made smaller still (tests): a few steps of everything
    "data": ["--n_train_tasks", "4", "--n_val_tasks", "2"],
    "sft_reflection": [
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "4",
        "--eval_num_reflection_samples",
        "4",
    ]
    + ["--reflection_max_new_tokens", "8"],
    "sft_policy": [
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "4",
        "--eval_num_policy_samples",
        "8",
    ],
    "rl": ["--max_steps", "3", "--per_device_train_batch_size", "4", "--num_generations", "2"]
    + ["--reflection_max_new_tokens", "8", "--num_train_tasks", "3"],
    "eval": ["--episodes_per_stage", "2", "--reflection_max_new_tokens", "8"],
}


def smoke_commands(root: Path) -> list[list[str]]:
    """The commands of the package's smoke.sh, as argv lists."""
    lines = [
        line.split()
        for line in (root / "smoke.sh").read_text().splitlines()
        if line.startswith("reflect-trl ")
    ]
    return [line[1:] for line in lines]


def test_the_smoke_preset_runs_end_to_end(scaffolded):
    commands = smoke_commands(scaffolded)
    assert [c[0] for c in commands] == ["check-env", "build-tiny", "data", "sft", "sft", "rl", "eval"]
    for argv in commands:
        if argv[0] == "check-env":
            argv = [*argv, "--tasks", "4"]
        elif "--config" in argv:
            recipe = Path(argv[argv.index("--config") + 1]).stem
            argv = [*argv, *SMALLER[recipe]]
            argv[argv.index("--config") + 1] = str(scaffolded / argv[argv.index("--config") + 1])
        assert reflect_trl(argv) == 0, argv
    work = Path.cwd()  # the recipes write under smoke/ of the working directory
    card = (work / "smoke/data" / NAME / "README.md").read_text()
    assert "In tokens of `smoke/models/tiny-llama-nc_corridor`" in card
    report = json.loads((work / "smoke/outputs/eval/results.json").read_text())
    names = [c["name"] for c in report["configurations"]]
    assert names == ["oracle", "random", "Reflect SFT (before RL)", "Reflect-RL"]
    assert {r["stage"] for r in report["results"]} == {"near", "middle", "far"}
    assert all(r["success_rate"] == 1.0 for r in report["results"] if r["configuration"] == "oracle")
    rl_card = (work / "smoke/outputs/rl/README.md").read_text()
    assert "ReflectAgent.from_pretrained(" in rl_card
    assert "provided by the plugin distribution `reflect-nc-corridor 0.1.0`" in rl_card


RECIPE_FILES = {
    "smoke.sh",
    *(f"recipes/{n}.yaml" for n in ("data", "sft_reflection", "sft_policy", "sft_plain", "rl", "eval")),
    *(f"recipes/smoke/{n}.yaml" for n in ("data", "sft_reflection", "sft_policy", "rl", "eval")),
}


def written(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_recipes_only_writes_the_recipes_of_a_registered_environment(tmp_path, monkeypatch, capsys):
    from reflect_trl.envs import _REGISTRY
    from test_recipes import PARSERS

    monkeypatch.setitem(_REGISTRY, "line_world", "_toy_env:LineWorldEnv")
    root = tmp_path / "mine"
    assert reflect_trl(["init-env", "--recipes-only", "line_world", "--output_dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {len(RECIPE_FILES)} files for environment 'line_world'" in out and "note:" not in out
    assert written(root) == RECIPE_FILES  # no package: no pyproject.toml, src/, tests/, README.md
    assert (root / "smoke.sh").stat().st_mode & 0o111
    assert smoke_commands(root)[0] == ["check-env", "line_world", "--strict"]
    for path in sorted(RECIPE_FILES - {"smoke.sh"}):
        assert yaml.safe_load((root / path).read_text())["env_name"] == "line_world", path
        kind = next(k for k in ("data", "sft", "rl", "eval") if Path(path).stem.startswith(k))
        PARSERS[kind](root / path, tmp_path / "out")  # the recipes parse with their config classes


def test_recipes_only_never_overwrites_and_takes_module_class(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert (
        reflect_trl(["init-env", "--recipes-only", "_toy_env:LineWorldEnv"]) == 0
    )  # default: this directory
    out = capsys.readouterr().out
    assert written(tmp_path) == RECIPE_FILES
    assert "note: reflect-trl commands find an environment by name: register 'line_world'" in out
    (tmp_path / "recipes" / "rl.yaml").write_text("mine")
    (tmp_path / "smoke.sh").unlink()
    assert reflect_trl(["init-env", "--recipes-only", "_toy_env:LineWorldEnv"]) == 2
    err = capsys.readouterr().err
    assert f"--recipes-only: {len(RECIPE_FILES) - 1} of the {len(RECIPE_FILES)} files exist already" in err
    assert "recipes/rl.yaml" in err and "nothing was written" in err
    assert (tmp_path / "recipes" / "rl.yaml").read_text() == "mine" and not (tmp_path / "smoke.sh").exists()
    for name, words in [("no_such_env", "unknown environment"), ("_toy_env:Nope", "cannot be imported"),
                        ("_toy_env:ACTIONS", "not a subclass of reflect_trl.envs.TextEnv")]:  # fmt: skip
        with pytest.raises(UsageError, match=words):
            init_recipes(name, tmp_path / "other")
    assert not (tmp_path / "other").exists()
