"""AutoExplore's ``packages`` corpus: the pinned extra, the split by repository, the held-out test questions, the
oracle on every split and stage, determinism, and the error when the extra is missing."""

from __future__ import annotations

import pickle
import re
import tomllib
from pathlib import Path

import pytest

from reflect_trl.cli import main as cli_main
from reflect_trl.envs.auto_explore import STAGES, AutoExploreEnv, repo_split
from reflect_trl.envs.auto_explore import packages as pk
from reflect_trl.envs.auto_explore.corpus import build_repo_tree
from reflect_trl.envs.auto_explore.example_repo import write_example_repo
from reflect_trl.envs.auto_explore.tasks import (
    REPO_SPLIT_WEIGHTS,
    assign_split,
    generate_repo_tasks,
    optimal_path,
)
from reflect_trl.envs.base import SPLITS
from reflect_trl.prompts import DEFAULT_LABELS

ROOT = Path(__file__).resolve().parents[2]
PERMISSIVE = {
    "MIT",
    "BSD-2-Clause",
    "BSD-3-Clause",
    "Apache-2.0",
    "ISC",
    "PSF-2.0",
    "Unlicense",
    "MIT OR Apache-2.0",
    "BSD-3-Clause OR Apache-2.0",
}

needs_corpus = pytest.mark.skipif(
    not pk.packages_installed(),
    reason=f"the pinned 'packages' corpus is not installed (install it with: {pk.INSTALL_COMMAND})",
)


# -- the extra and the manifest (no install needed) ---------------------------------------------------------
def test_extra_pins_exactly_the_manifest_and_ci_installs_it():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["optional-dependencies"][pk.EXTRA] == pk.extra_requirements()
    for requirement in pk.extra_requirements():
        assert re.fullmatch(r"[A-Za-z0-9._-]+==[0-9][0-9A-Za-z.]*", requirement), requirement
    names = [p.name for p in pk.PACKAGE_CORPUS]
    assert names == sorted(names) and len(set(names)) == len(names)
    assert all(p.licence in PERMISSIVE for p in pk.PACKAGE_CORPUS)
    install_extras = re.search(r"^install-extras:.*\n\t(.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert install_extras and pk.EXTRA in install_extras.group(1)


def test_repo_split_depends_on_the_repository_only(tmp_path):
    names = [f"repo{i}" for i in range(400)]
    assert [repo_split(n) for n in names] == [repo_split(n) for n in names]
    for name in names[:20]:
        assert {assign_split(name, t, q, "repo") for t in ("a.py", "b/c.md") for q in ("x?", "y?")} == {
            repo_split(name)
        }
    shares = [sum(repo_split(n) == s for n in names) / len(names) for s in SPLITS]
    assert all(abs(share - w) < 0.08 for share, w in zip(shares, REPO_SPLIT_WEIGHTS, strict=True))
    # any corpus can be split by repository: every task of a repository carries its split
    env = AutoExploreEnv(roots=[str(write_example_repo(tmp_path))], split_unit="repo")
    tasks = [t for s in SPLITS for t in env.task_pool(s)]
    assert tasks and {t.data["split"] for t in tasks} == {repo_split("coffee_shop")}


def test_corpus_kwarg_is_checked():
    with pytest.raises(ValueError, match="corpus must be one of"):
        AutoExploreEnv(corpus="nope")
    with pytest.raises(ValueError, match="takes no roots"):
        AutoExploreEnv(corpus="packages", roots=["trl"])
    with pytest.raises(ValueError, match="split_unit='repo'"):
        AutoExploreEnv(corpus="packages", split_unit="file")
    assert AutoExploreEnv().split_unit == "file" and AutoExploreEnv(corpus="packages").split_unit == "repo"


def test_missing_extra_names_the_install_command(monkeypatch, capsys):
    absent = pk.CorpusPackage("no-such-corpus-package-xyz", "1.0", "no_such_corpus_package_xyz", "MIT")
    with pytest.raises(pk.CorpusNotInstalledError, match=re.escape(pk.INSTALL_COMMAND)):
        pk.package_corpus_roots([absent])
    wrong = pk.CorpusPackage("pytest", "0.0.1", "_pytest", "MIT")  # installed, at another version
    with pytest.raises(
        pk.CorpusNotInstalledError, match=r"pytest \S+ is installed, the corpus pins pytest==0.0.1"
    ):
        pk.package_corpus_roots([wrong])
    # the whole extra missing, as on an install without it
    monkeypatch.setattr(pk, "_locate", lambda package: f"{package.requirement} is not installed")
    assert not pk.packages_installed()
    env = AutoExploreEnv(corpus="packages")  # building the corpus is lazy: the error comes on first use
    with pytest.raises(ModuleNotFoundError, match=re.escape(pk.INSTALL_COMMAND)) as info:
        env.make_tasks("test", 1)
    assert f"{len(pk.PACKAGE_CORPUS)} of {len(pk.PACKAGE_CORPUS)} pinned packages" in str(info.value)
    assert cli_main(["corpus-stats"]) == 1
    assert pk.INSTALL_COMMAND in capsys.readouterr().err


# -- the installed corpus -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def packages_env():
    return AutoExploreEnv(corpus="packages")


@needs_corpus
def test_whole_repositories_are_assigned_to_splits(packages_env):
    assert packages_env.corpus.names == sorted(p.name for p in pk.PACKAGE_CORPUS)
    repos = {s: {t.data["repo"] for t in packages_env.task_pool(s)} for s in SPLITS}
    assert not repos["test"] & (repos["train"] | repos["validation"])
    assert not repos["train"] & repos["validation"]
    for split in SPLITS:
        assert all(repo_split(r) == split for r in repos[split])
        assert all(t.data["split"] == split for t in packages_env.task_pool(split))
        for stage in STAGES:
            assert packages_env.task_pool(split, stage), (split, stage)
    assert len(repos["test"]) >= 10 and len(repos["train"]) >= 40


@needs_corpus
def test_at_least_100_distinct_depth1_test_questions_from_unseen_repositories(packages_env):
    stats = pk.corpus_stats()
    test = stats["splits"]["test"]
    assert test["distinct_questions"]["depth1"] >= 100
    assert stats["splits"]["train"]["distinct_questions"]["depth1"] >= 500
    assert not any(stats["repositories_shared_between_splits"].values())
    questions = {t.data["question"] for t in packages_env.task_pool("test", "depth1")}
    assert len(questions) == test["distinct_questions"]["depth1"]
    text = pk.format_stats(stats)
    assert "repositories shared between splits: none" in text and "test repositories:" in text


@needs_corpus
@pytest.mark.parametrize("split", SPLITS)
def test_oracle_solves_every_stage_of_the_packages_corpus(packages_env, split):
    for stage in STAGES:
        for task in packages_env.make_tasks(split, 6, seed=11, difficulty=stage):
            obs, steps, done = packages_env.reset(task=task), 0, False
            while not done:  # the horizon ends every episode
                assert len(obs.actions) <= len(DEFAULT_LABELS)
                obs, _, terminated, truncated, info = packages_env.step(packages_env.oracle_action())
                steps, done = steps + 1, terminated or truncated
            assert info["success"], task.task_id
            assert steps == len(optimal_path(task.data["targets"][0])) == len(task.data["optimal_path"])


@needs_corpus
def test_packages_tasks_are_deterministic(packages_env):
    again = AutoExploreEnv(corpus="packages")
    for split in SPLITS:
        a = [t.to_dict() for t in packages_env.make_tasks(split, 12, seed=5)]
        assert a == [t.to_dict() for t in again.make_tasks(split, 12, seed=5)]
    # an uncached rebuild of the smallest repository of each split gives the same tasks, in the same order
    specs = {s.name: s for s in pk.package_corpus_roots()}
    for split in SPLITS:
        served: dict[str, list[dict]] = {}
        for task in packages_env.task_pool(split):
            served.setdefault(task.data["repo"], []).append(task.to_dict())
        name = min(served, key=lambda r: (len(served[r]), r))
        spec = specs[name]
        tree = build_repo_tree(spec.path, name, mount=spec.package, version=spec.version, source="package")
        rebuilt = [t.to_dict() for t in generate_repo_tasks(tree, split_unit="repo")]
        assert rebuilt == [t.to_dict() for t in generate_repo_tasks(tree, split_unit="repo")]
        assert rebuilt and sorted(rebuilt, key=lambda t: t["task_id"]) == sorted(
            served[name], key=lambda t: t["task_id"]
        )


@needs_corpus
def test_packages_env_holdout_pickle_and_card(packages_env):
    held_repo = min(t.data["repo"] for t in packages_env.task_pool("train"))
    held = AutoExploreEnv(corpus="packages", holdout_repos=[held_repo])
    assert {t.data["repo"] for t in held.task_pool("test")} == {held_repo}
    task = packages_env.make_tasks("test", 1, seed=0, difficulty="depth2")[0]
    packages_env.reset(task=task)
    packages_env.step(packages_env.oracle_action())
    copy = pickle.loads(pickle.dumps(packages_env))
    assert copy.corpus_name == "packages" and copy.state_key() == packages_env.state_key()
    card = packages_env.card()
    assert card["settings"]["corpus"] == "packages" and card["settings"]["split_unit"] == "repo"
    assert {r["version"] for r in card["corpus"]["repositories"]} <= {p.version for p in pk.PACKAGE_CORPUS}
