"""AutoExplore: corpus filters, task generation, splits, curriculum, episodes, oracle, leave-out, truncation."""

from __future__ import annotations

import json
import threading

import pytest

from reflect_trl.envs import make_env
from reflect_trl.envs.auto_explore import (
    STAGES,
    AutoExploreEnv,
    build_repo_tree,
    corpus_card,
    load_tasks,
    save_tasks,
    task_card,
)
from reflect_trl.envs.auto_explore.content import truncate_content
from reflect_trl.envs.auto_explore.corpus import file_kind
from reflect_trl.envs.auto_explore.example_repo import write_example_repo
from reflect_trl.envs.auto_explore.tasks import docstring_summary, optimal_path, stage_of_depth
from reflect_trl.envs.base import SPLITS, Task
from reflect_trl.prompts import DEFAULT_LABELS, build_prompt

SECTIONS = (
    "# Task",
    "# Current working directory",
    "# Files under current working directory",
    "# Command history",
    "# Execution result of your last command",
)


@pytest.fixture(scope="module")
def repo_root(tmp_path_factory):
    return write_example_repo(tmp_path_factory.mktemp("repos"))


@pytest.fixture(scope="module")
def env(repo_root):
    return AutoExploreEnv(roots=[str(repo_root)])


@pytest.fixture(scope="module")
def default_env():
    return make_env("auto_explore")


def all_tasks(env: AutoExploreEnv) -> list[Task]:
    return [t for split in SPLITS for t in env.task_pool(split)]


def run_oracle(env: AutoExploreEnv, task: Task) -> tuple[bool, int, float]:
    obs = env.reset(task=task)
    total = 0.0
    for step in range(env.horizon):
        assert len(obs.actions) <= len(DEFAULT_LABELS)
        obs, reward, terminated, truncated, info = env.step(env.oracle_action())
        total += reward
        if terminated or truncated:
            return bool(info["success"]), step + 1, total
    raise AssertionError("episode did not end within the horizon")


# -- corpus ---------------------------------------------------------------------------------------------
def test_corpus_filters(env, repo_root):
    tree = env.corpus.repo("coffee_shop")
    files = tree.walk_files()
    assert files == sorted(files)
    assert "README.md" in files and "coffee/storage/db/schema.py" in files and "data/beans.csv" in files
    for dropped in (
        "tests/test_menu.py",  # test dir
        ".env",  # hidden
        "coffee/_private_helpers.py",  # private
        "coffee/__init__.py",  # init files are left out by default
        "build/generated.py",  # build dir
        "notes.txt",  # too short
        "logo.png",  # suffix
    ):
        assert dropped not in files, dropped
    assert not tree.is_dir("tests") and not tree.is_dir("build")
    card = corpus_card(env.corpus)
    assert card["repositories"][0]["files_kept"] == len(files)
    assert file_kind("x.csv") == "data" and file_kind("x.py") == "code" and file_kind("x.sh") == "exec"


def test_corpus_rejects_binary_and_non_ascii(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    (root / "good.md").write_text("# Good file\n\nplain ascii text that is long enough\n")
    (root / "latin1.txt").write_bytes("caf\xe9 cr\xe8me br\xfbl\xe9e ".encode("latin-1") * 5)
    (root / "mostly_unicode.md").write_text("日本語のテキストです。" * 10)
    (root / "nul.json").write_bytes(b'{"a": 1}\x00' * 10)
    (root / "caf\u00e9.py").write_text("def f():\n    return 'non-ascii file names are dropped'\n")
    assert build_repo_tree(root).walk_files() == ["good.md"]


def test_pruning_keeps_listings_small_and_protects_targets(tmp_path):
    root = tmp_path / "big"
    (root / "many").mkdir(parents=True)
    for i in range(40):
        (root / "many" / f"module_{i:02d}.py").write_text(f"def function_number_{i}():\n    return {i}\n")
    (root / "many" / "sub").mkdir()
    (root / "many" / "sub" / "leaf.py").write_text("def leaf_function():\n    return 'leaf'\n")
    tree = build_repo_tree(root, max_options=20)
    for rel in tree.pruned:
        assert tree.listing(rel).num_options(at_root=rel == "") <= 20
    assert tree.stats["files_pruned"] > 0
    assert tree.listing("many") == build_repo_tree(root, max_options=20).listing("many")  # deterministic
    hidden = sorted(set(tree.full["many"].files) - set(tree.pruned["many"].files))[0]
    protected = tree.listing("many", protect=[f"many/{hidden}"])
    assert hidden in protected.files and protected.num_options(at_root=False) <= 20
    # A task file may target the hidden file: the env shows it and the oracle reaches it.
    task = Task(
        "auto_explore",
        "custom-1",
        "depth1",
        3,
        {"question": "Q?", "repo": "big", "targets": [f"many/{hidden}"]},
    )
    env = AutoExploreEnv(roots=[str(root)], max_options=20)
    success, steps, _ = run_oracle(env, task)
    assert success and steps == 3


# -- tasks ----------------------------------------------------------------------------------------------
def test_generated_tasks_are_consistent(env):
    tasks = all_tasks(env)
    kinds = {t.data["kind"] for t in tasks}
    assert {"class_name", "function_name", "function_doc", "heading", "config_key"} <= kinds
    tree = env.corpus.repo("coffee_shop")
    for task in tasks:
        (target,) = task.data["targets"]
        assert tree.is_file(target)
        assert task.data["depth"] == target.count("/")
        assert task.difficulty == stage_of_depth(task.data["depth"])
        assert task.data["optimal_path"] == optimal_path(target)
        assert task.data["optimal_path"][-2:] == [
            f"cat {target.split('/')[-1]}",
            f"id {target.split('/')[-1]}",
        ]
    questions = [t.data["question"] for t in tasks]
    assert len(questions) == len(set(questions))
    assert any("`charge_card`" in q for q in questions)
    assert any('"Installation steps"' in q for q in questions)
    assert any("`currency` to `EUR`" in q for q in questions)


def test_splits_are_disjoint_by_file(env, default_env):
    for e in (env, default_env):
        files = {
            split: {(t.data["repo"], t.data["targets"][0]) for t in e.task_pool(split)} for split in SPLITS
        }
        assert not files["train"] & files["validation"]
        assert not files["train"] & files["test"]
        assert not files["validation"] & files["test"]
        assert all(t.data["split"] == split for split in SPLITS for t in e.task_pool(split))


def test_make_tasks_is_deterministic(env, repo_root):
    again = AutoExploreEnv(roots=[str(repo_root)])
    for split in SPLITS:
        a = env.make_tasks(split, 7, seed=3)
        assert [t.to_dict() for t in a] == [t.to_dict() for t in again.make_tasks(split, 7, seed=3)]
    a = [t.task_id for t in env.make_tasks("train", 10, seed=1)]
    b = [t.task_id for t in env.make_tasks("train", 10, seed=2)]
    assert a != b
    # More tasks than distinct ones: fresh shuffles, repeats marked, seeds all distinct.
    pool = env.task_pool("train", "depth3")
    many = env.make_tasks("train", 3 * len(pool), seed=0, difficulty="depth3")
    assert {t.task_id.split("@")[0] for t in many} == {t.task_id for t in pool}
    assert len({t.task_id for t in many}) == len(many) and len({t.seed for t in many}) == len(many)


def test_curriculum_groups_by_depth(env, default_env):
    expected = {"depth1": (0, 1), "depth2": (2,), "depth3": (3, 4, 5, 6)}
    for e in (env, default_env):
        for stage in STAGES:
            tasks = e.make_tasks("train", 12, seed=0, difficulty=stage)
            assert tasks and all(t.difficulty == stage for t in tasks)
            assert all(t.data["depth"] in expected[stage] for t in tasks)
    mixed = default_env.make_tasks("train", 9, seed=0)
    assert [t.difficulty for t in mixed] == list(STAGES) * 3


def test_holdout_repository_split(default_env):
    held = AutoExploreEnv(holdout_repos=["accelerate"])
    test = held.task_pool("test")
    assert test and {t.data["repo"] for t in test} == {"accelerate"}
    for split in ("train", "validation"):
        assert held.task_pool(split) and all(t.data["repo"] != "accelerate" for t in held.task_pool(split))
    n_accelerate = sum(t.data["repo"] == "accelerate" for t in all_tasks(default_env))
    assert len(test) == n_accelerate
    with pytest.raises(ValueError, match="not in the corpus"):
        _ = AutoExploreEnv(holdout_repos=["no_such_repo"]).corpus


def test_save_and_load_tasks(env, tmp_path, repo_root):
    tasks = env.make_tasks("validation", 5, seed=0)
    path = save_tasks(tmp_path / "tasks.jsonl", tasks)
    loaded = load_tasks(path)
    assert [t.to_dict() for t in loaded] == [t.to_dict() for t in tasks]
    # An env reading the file serves exactly those tasks (as distinct tasks of their split).
    from_file = AutoExploreEnv(roots=[str(repo_root)], tasks_file=str(path))
    assert {t.task_id for t in from_file.task_pool("validation")} == {t.task_id for t in tasks}
    assert from_file.task_pool("train") == []
    for task in from_file.make_tasks("validation", 5, seed=0):
        assert run_oracle(from_file, task)[0]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "invalid JSON"),
        ('{"env": "taxi", "task_id": "a", "difficulty": "depth1", "seed": 0, "data": {}}', "field 'env'"),
        (
            '{"env": "auto_explore", "task_id": "a", "difficulty": "hard", "seed": 0, "data": {}}',
            "field 'difficulty'",
        ),
        (
            '{"env": "auto_explore", "task_id": "a", "difficulty": "depth1", "data": {}}',
            "missing field 'seed'",
        ),
        (
            '{"env": "auto_explore", "task_id": "a", "difficulty": "depth1", "seed": 0, "data": {"question": "q", "repo": "r"}}',
            "missing field 'data.targets'",
        ),
        (
            '{"env": "auto_explore", "task_id": "a", "difficulty": "depth1", "seed": 0, '
            '"data": {"question": "q", "repo": "r", "targets": ["../etc/passwd"]}}',
            "field 'data.targets'",
        ),
        (
            '{"env": "auto_explore", "task_id": "a", "difficulty": "depth1", "seed": 0, '
            '"data": {"question": "q", "repo": "r", "targets": ["a.py"], "split": "dev"}}',
            "field 'data.split'",
        ),
    ],
)
def test_load_tasks_errors_name_file_line_and_field(tmp_path, line, message):
    good = Task("auto_explore", "ok", "depth1", 0, {"question": "q", "repo": "r", "targets": ["a.py"]})
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(good.to_dict()) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=message) as info:
        load_tasks(path)
    assert f"{path}:2" in str(info.value)


def test_tasks_file_with_unknown_target_is_rejected(tmp_path, repo_root):
    task = Task(
        "auto_explore", "x", "depth1", 0, {"question": "q", "repo": "coffee_shop", "targets": ["nope.py"]}
    )
    path = save_tasks(tmp_path / "t.jsonl", [task])
    with pytest.raises(ValueError, match="nope.py"):
        AutoExploreEnv(roots=[str(repo_root)], tasks_file=str(path)).task_pool("train")


def test_docstring_summary():
    assert (
        docstring_summary("Trainer for the [`SFTTrainer`] method. More text.")
        == "Trainer for the `SFTTrainer` method"
    )
    assert docstring_summary("Short.") is None
    assert docstring_summary(None) is None
    assert docstring_summary("Uses :class:`~torch.nn.Module` to build the model.\n\nArgs: x") == (
        "Uses `torch.nn.Module` to build the model"
    )


# -- episodes -------------------------------------------------------------------------------------------
def test_observation_layout(env):
    task = next(t for t in all_tasks(env) if t.data["targets"] == ["coffee/payments/card.py"])
    obs = env.reset(task=task)
    positions = [obs.text.index(s) for s in SECTIONS]
    assert positions == sorted(positions)
    assert "# Options" not in obs.text and "Choose" not in obs.text
    assert obs.text.split("\n")[1] == task.data["question"]
    assert "# Current working directory\n./\n" in obs.text
    assert obs.actions == (
        "cd coffee",
        "cd config",
        "cd data",
        "cd docs",
        "cd scripts",
        "cat README.md",
        "id README.md",
    )
    obs, *_ = env.step(obs.actions.index("cd coffee"))
    assert obs.actions[0] == "cd .." and "# Current working directory\ncoffee/\n" in obs.text
    assert "payments/\n" in obs.text and "menu.py\n" in obs.text
    obs, *_ = env.step(obs.actions.index("cat menu.py"))
    assert "Executing: cat menu.py\nSuccess: The content of menu.py is:\n" in obs.text
    assert "cat menu.py" not in obs.actions and "id menu.py" in obs.actions  # no second cat
    assert "# Command history\ncd coffee\ncat menu.py\n" in obs.text
    prompt = build_prompt(obs.text, obs.actions, "reflection").text
    assert prompt.count("# Options:") == 1


def wander_to_horizon(env: AutoExploreEnv, task: Task) -> tuple[float, bool, bool, dict]:
    """Play ``task`` without ever answering (``cd coffee`` when offered, else the first option) until the episode
    ends; returns (total reward, terminated, truncated, last info)."""
    obs, total = env.reset(task=task), 0.0
    terminated = truncated = False
    info: dict = {}
    while not (terminated or truncated):
        obs, reward, terminated, truncated, info = env.step(
            obs.actions.index("cd coffee") if "cd coffee" in obs.actions else 0
        )
        total += reward
    return total, terminated, truncated, info


def test_rewards_success_failure_and_horizon(env):
    task = next(t for t in all_tasks(env) if t.data["targets"] == ["coffee/payments/card.py"])
    success, steps, total = run_oracle(env, task)
    assert success and steps == 4
    assert total == pytest.approx((env.horizon - steps) / env.horizon)

    obs = env.reset(task=task)
    obs, reward, terminated, truncated, info = env.step(obs.actions.index("id README.md"))
    assert terminated and not truncated and info["success"] is False and env.identified == "README.md"
    assert reward == pytest.approx(-(1 + env.horizon) / env.horizon)

    short = AutoExploreEnv(roots=env.roots, horizon=4)
    total, terminated, truncated, info = wander_to_horizon(short, task)
    assert truncated and not terminated and info["success"] is False and short.t == 4
    assert total == pytest.approx(-4 / 4 - 1)
    with pytest.raises(RuntimeError):
        short.step(0)


def test_step_cost_zero_makes_a_quick_wrong_answer_as_bad_as_a_long_one(env):
    """step_cost=0 (an RL option): success +1, any failure -1 whatever its length; with the default cost a quick
    wrong `id` (-1 - 1/H) beats a search that fails (-2), which teaches a weak policy to answer at once."""
    task = next(t for t in all_tasks(env) if t.data["targets"] == ["coffee/payments/card.py"])
    free = AutoExploreEnv(roots=env.roots, step_cost=0.0)
    success, steps, total = run_oracle(free, task)
    assert success and steps == 4 and total == pytest.approx(1.0)
    obs = free.reset(task=task)
    _, reward, terminated, *_ = free.step(obs.actions.index("id README.md"))
    assert terminated and reward == pytest.approx(-1.0)
    total, _, truncated, _ = wander_to_horizon(
        AutoExploreEnv(roots=env.roots, horizon=4, step_cost=0.0), task
    )
    assert truncated and total == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="step_cost must be >= 0, got -1"):
        AutoExploreEnv(roots=env.roots, step_cost=-1)


def test_oracle_solves_every_example_task(env):
    tasks = all_tasks(env)
    assert len(tasks) >= 25
    for task in tasks:
        success, steps, total = run_oracle(env, task)
        assert success, task.task_id
        assert steps == len(task.data["optimal_path"]) <= env.horizon
        assert total > 0


def test_oracle_recovers_after_wandering(env):
    task = next(t for t in all_tasks(env) if t.data["targets"] == ["coffee/storage/db/schema.py"])
    obs = env.reset(task=task)
    for command in ("cd docs", "cat api.md", "cd ..", "cd coffee", "cd payments"):
        obs, *_ = env.step(obs.actions.index(command))
    assert env.oracle_plan() == ["cd ..", "cd storage", "cd db", "cat schema.py", "id schema.py"]
    success = False
    while not env.done:
        *_, info = env.step(env.oracle_action())
        success = info["success"]
    assert success and env.t == 10


def test_oracle_solves_default_corpus_sample(default_env):
    """A few hundred tasks of the installed-package corpus, every split and stage."""
    card = task_card(all_tasks(default_env))
    assert card["total"] > 500 and all(card["by_stage"][s] > 50 for s in STAGES)
    tasks = [t for split in SPLITS for t in default_env.make_tasks(split, 100, seed=7)]
    for task in tasks:
        success, steps, _ = run_oracle(default_env, task)
        assert success and steps <= default_env.horizon, task.task_id
    assert {t.data["repo"] for t in tasks} == set(default_env.corpus.names)


def test_default_corpus_listings_fit_the_labels(default_env):
    for tree in default_env.corpus.repos.values():
        assert tree.version  # installed packages record their version
        for rel in tree.pruned:
            assert tree.listing(rel).num_options(at_root=rel == "") <= len(DEFAULT_LABELS)


def test_leave_out_keeps_the_target_path(repo_root):
    env = AutoExploreEnv(roots=[str(repo_root)], leaveout_prob=0.9)
    base = AutoExploreEnv(roots=[str(repo_root)])
    hidden_something = False
    for task in all_tasks(env):
        for seed in range(3):
            obs = env.reset(task=task, seed=seed)
            full = base.reset(task=task).actions
            assert set(obs.actions) <= set(full)
            hidden_something |= len(obs.actions) < len(full)
            first = task.data["optimal_path"][0]
            assert first in obs.actions
            again = env.reset(task=task, seed=seed)
            assert again == obs  # the same seed hides the same entries
        assert run_oracle(env, task)[0]
    assert hidden_something


def test_content_truncation_with_a_tiny_tokenizer(tmp_path):
    from reflect_trl.tiny_models import build_tokenizer

    tokenizer = build_tokenizer(
        ["def function():\n    return value\n" * 50, "coffee menu prices"], vocab_size=300
    )
    tokenizer.save_pretrained(tmp_path / "tok")
    long_text = "\n".join(f"line {i} with several words of text" for i in range(100))
    repo_root = write_example_repo(tmp_path / "repos")
    (repo_root / "docs" / "long.md").write_text(long_text)
    env = AutoExploreEnv(
        roots={"coffee_long": str(repo_root)},
        tokenizer_name_or_path=str(tmp_path / "tok"),
        max_content_tokens=30,
        max_content_lines=10,
    )
    task = Task(
        "auto_explore",
        "long",
        "depth1",
        0,
        {"question": "Q?", "repo": "coffee_long", "targets": ["docs/long.md"]},
    )
    obs = env.reset(task=task)
    obs, *_ = env.step(obs.actions.index("cd docs"))
    obs, *_ = env.step(obs.actions.index("cat long.md"))
    shown = obs.text.split("Success: The content of long.md is:\n", 1)[1]
    body, note = shown.rsplit("\n", 1)
    assert note.startswith("[Large file") and "30 tokens" in note
    assert len(tokenizer(body, add_special_tokens=False)["input_ids"]) <= 31
    assert body.startswith("line 0 with")
    # Without a tokenizer, words and punctuation marks are counted.
    cut = truncate_content(long_text, "long.md", max_lines=3, max_tokens=100)
    assert cut.split("\n")[:3] == long_text.split("\n")[:3] and "first 3 lines" in cut
    cut = truncate_content(long_text, "long.md", max_lines=50, max_tokens=10)
    assert cut.split("\n")[:2] == ["line 0 with several words of text", "line 1 with"]
    assert truncate_content("x = f(a, b)", "m.py", max_lines=5, max_tokens=4).startswith("x = f(\n")
    assert truncate_content("a,b\n" * 20, "x.csv", max_lines=20, max_tokens=500).count("a,b") == 5
    licensed = "# Copyright 2024 Someone\n# Licensed under the Apache License\n\nimport os\n\n\n\nX = 1\n"
    assert truncate_content(licensed, "m.py", max_lines=20, max_tokens=100) == "import os\n\nX = 1"


def test_clone_is_independent(env):
    task = next(t for t in all_tasks(env) if t.data["targets"] == ["coffee/storage/db/schema.py"])
    obs = env.reset(task=task)
    env.step(obs.actions.index("cd coffee"))
    twin = env.clone()
    assert twin.observation == env.observation and twin.corpus is env.corpus
    twin.step(twin.observation.actions.index("cd storage"))
    assert env.cwd == "coffee" and twin.cwd == "coffee/storage"
    assert env.history == ["cd coffee"] and len(twin.trace) == 2 and len(env.trace) == 1
    import copy

    deep = copy.deepcopy(env)
    assert deep.corpus is env.corpus and deep.history == env.history and deep.history is not env.history


def test_pickle_round_trip_mid_episode(env):
    import pickle

    task = next(t for t in all_tasks(env) if t.data["targets"] == ["coffee/storage/db/schema.py"])
    obs = env.reset(task=task)
    env.step(obs.actions.index("cd coffee"))
    twin = pickle.loads(pickle.dumps(env))
    assert twin.observation == env.observation and twin.history == env.history
    while not twin.done:
        *_, info = twin.step(twin.oracle_action())
    assert info["success"] and env.cwd == "coffee"


def test_card_records_corpus_and_counts(default_env):
    card = default_env.card()
    json.dumps(card)  # JSON-able
    names = {r["name"]: r for r in card["corpus"]["repositories"]}
    assert set(names) == {"trl", "peft", "datasets", "accelerate"} and all(
        r["version"] for r in names.values()
    )
    assert card["tasks"]["total"] == sum(sum(v.values()) for v in card["tasks_per_split_and_stage"].values())


def test_reset_draws_a_task_from_a_seed(env):
    a = env.reset(seed=5)
    task_a = env.task
    b = env.reset(seed=5)
    assert a == b and env.task == task_a and task_a.data["split"] == "train" and task_a.seed == 5
    drawn = set()
    for seed in range(40):
        env.reset(seed=seed)
        drawn.add(env.task.difficulty)
    assert drawn == set(STAGES)


def test_envs_step_side_by_side_in_threads(env):
    tasks = all_tasks(env)[:16]
    expected = {t.task_id: run_oracle(env, t) for t in tasks}
    results: dict[str, tuple[bool, int, float]] = {}
    errors: list[BaseException] = []

    def worker(chunk: list[Task]) -> None:
        local = env.clone()
        try:
            for _ in range(3):
                for task in chunk:
                    results[task.task_id] = run_oracle(local, task)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(tasks[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert results == expected


# -- state key (gigpo step groups) ----------------------------------------------------------------------------
def walk(env: AutoExploreEnv, task: Task, commands: list[str], seed: int | None = None) -> tuple:
    """Reset, run ``commands`` (by text) and return the state key."""
    env.reset(task=task, seed=seed)
    for command in commands:
        env.step(env.observation.actions.index(command))
    return env.state_key()


def test_state_key_merges_routes_and_separates_futures(env, repo_root):
    task = next(t for t in all_tasks(env) if t.data["targets"] == ["coffee/storage/db/schema.py"])
    key = walk(env, task, ["cd coffee"])
    hash(key)
    direct = env.observation.text
    assert walk(env, task, ["cd coffee", "cd ..", "cd coffee"]) == key
    assert walk(env, task, ["cd coffee", "cd storage", "cd .."]) == key
    assert (
        "Executing: cd ..\n" in env.observation.text and "Executing: cd ..\n" not in direct
    )  # not in the key
    assert walk(env, task, ["cd docs", "cd ..", "cd coffee"]) == key
    assert walk(env, task, []) != key  # another directory
    # A file already opened is no longer offered (filter_catted): a different future, a different key ...
    opened = walk(env, task, ["cd coffee", "cat menu.py"])
    assert opened != key and "cat menu.py" not in env.observation.actions
    assert walk(env, task, ["cat README.md", "cd coffee", "cat menu.py"]) != opened
    assert walk(env, task, ["cd coffee", "cat menu.py", "cd payments", "cd .."]) == opened
    # ... but without the filter, opening a file changes neither options nor rewards: same key.
    unfiltered = AutoExploreEnv(roots=[str(repo_root)], filter_catted=False)
    assert walk(unfiltered, task, ["cd coffee", "cat menu.py"]) == walk(unfiltered, task, ["cd coffee"])
    # Another task in the same directory is another state.
    other = next(t for t in all_tasks(env) if t.data["targets"] == ["coffee/menu.py"])
    assert walk(env, other, ["cd coffee"]) != key
    # The end of the episode: which file was identified.
    assert walk(env, other, ["cd coffee", "id menu.py"]) != walk(env, other, ["cd coffee", "id orders.py"])


def test_state_key_is_stable_across_clones_instances_and_pickle(env, repo_root):
    import pickle

    task = next(t for t in all_tasks(env) if t.data["targets"] == ["coffee/storage/db/schema.py"])
    key = walk(env, task, ["cd coffee", "cat menu.py"])
    assert env.clone().state_key() == key and pickle.loads(pickle.dumps(env)).state_key() == key
    fresh = AutoExploreEnv(roots=[str(repo_root)])
    assert (
        walk(fresh, task, ["cd coffee", "cat menu.py"], seed=123) == key
    )  # no leave-out: the seed is irrelevant
    with pytest.raises(RuntimeError, match="before reset"):
        AutoExploreEnv(roots=[str(repo_root)]).state_key()


def test_state_key_separates_leave_out_seeds(repo_root):
    env = AutoExploreEnv(roots=[str(repo_root)], leaveout_prob=0.6)
    task = next(t for t in all_tasks(env) if t.data["targets"] == ["coffee/storage/db/schema.py"])
    views = {}
    for seed in range(6):
        env.reset(task=task, seed=seed)
        views[seed] = (env.observation.actions, env.state_key())
    assert len({actions for actions, _ in views.values()}) > 1  # the seeds hide different entries ...
    assert len({key for _, key in views.values()}) == 6  # ... so every seed is its own state
    other = AutoExploreEnv(roots=[str(repo_root)], leaveout_prob=0.6)
    assert walk(other, task, [], seed=3) == views[3][1]  # same task and seed, another instance: same key
    assert walk(env, task, ["cd coffee", "cd .."], seed=3) == views[3][1]


def test_instance_key_merges_the_repeats_of_a_task(default_env):
    """Asking for more tasks than a split has cycles through them (``@r<k>`` ids): a repeat is the same instance."""
    pool = default_env.task_pools()["test"]["depth1"]
    tasks = default_env.make_tasks("test", 5 * len(pool) + 1, seed=1000, difficulty="depth1")
    keys = [default_env.instance_key(t) for t in tasks]
    assert len(set(keys)) == len(pool) < len(tasks)
    assert len({t.task_id for t in tasks}) == len(tasks), "the ids themselves stay unique"
    for task, key in zip(tasks, keys, strict=True):
        assert task.task_id.startswith(key) and "@r" not in key
