"""Tests of the SFT data builder, on a toy environment and on DangerousTaxi."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

from _toy_env import ACTIONS, JUMP, RIGHT, STAY, WALK_RIGHT, LineWorldEnv, LineWorldReflector
from reflect_trl.cli.data import build_datasets_cli
from reflect_trl.data.builder import (
    DATASET_NAMES,
    METADATA_COLUMNS,
    DataBuilderConfig,
    build_datasets,
    generate_rows,
)
from reflect_trl.data.io import read_jsonl
from reflect_trl.data.trajectories import candidate_mistakes
from reflect_trl.envs import Task, make_env
from reflect_trl.prompts import (
    ACTION_CUE,
    DEFAULT_LABELS,
    STOP_MARKER,
    build_prompt,
    read_option_labels,
    reflection_prompt,
)


def toy_config(tmp_path: Path, **overrides) -> DataBuilderConfig:
    values = dict(
        env_name="line_world",
        n_train_tasks=12,
        n_val_tasks=4,
        negative_prob=0.7,
        negatives_per_trajectory=2,
        seed=3,
        output_dir=str(tmp_path),
        progress=False,
    )
    values.update(overrides)
    return DataBuilderConfig(**values)


def build_toy(tmp_path: Path, **overrides):
    config = toy_config(tmp_path, **overrides)
    return config, build_datasets(config, env=LineWorldEnv(), reflector=LineWorldReflector())


@pytest.fixture(scope="module")
def toy_build(tmp_path_factory):
    """(config, data sets, output root) of one default toy build, shared by the read-only tests."""
    root = tmp_path_factory.mktemp("toy_data")
    config, result = build_toy(root)
    return config, result, root


def replay_rows(env, rows: list[dict], labels=DEFAULT_LABELS, shuffled: bool = False) -> int:
    """Replay every trajectory of a data set and check each row against the live environment; return the
    number of negative rows seen. Checks: the row's state text, the oracle action and label, and -- for a
    negative row -- that the action before it was legal, not the oracle's and did not end the episode."""
    by_task: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_task[row["task_id"]].append(row)
    negatives = 0
    for task_rows in by_task.values():
        task_rows.sort(key=lambda r: r["step"])
        first = task_rows[0]
        assert [r["step"] for r in task_rows] == list(range(len(task_rows)))
        split, index = first["task_id"].split("-")[1], int(first["task_id"].split("-")[-1])
        tasks = env.make_tasks(split, index + 1, seed=first["_seed_base"], difficulty=first["difficulty"])
        task = tasks[index]
        assert task.task_id == first["task_id"]
        assert task.seed == first["seed"]
        obs = env.reset(task=task)
        for index, row in enumerate(task_rows):
            assert row["num_options"] == len(obs.actions)
            assert row["action_index"] == env.oracle_action()
            assert row["action_text"] == obs.actions[row["action_index"]]
            assert obs.text.rstrip() in row["prompt"]
            if not shuffled:
                assert row["option_index"] == row["action_index"]
            if row["prompt"].endswith(ACTION_CUE):  # policy rows: the label is the oracle action's option
                assert row["completion"] == labels[row["option_index"]]
                option_line = f"{labels[row['option_index']]}. {obs.actions[row['action_index']]}\n"
                assert option_line in row["prompt"]
            if index + 1 < len(task_rows):
                nxt = task_rows[index + 1]
                action = nxt["last_action_index"]
                assert 0 <= action < len(obs.actions), "the action taken must be legal"
                if nxt["is_negative"]:
                    negatives += 1
                    assert action != row["action_index"], "an injected mistake is not the oracle's action"
                else:
                    assert action == row["action_index"], "outside mistakes the trajectory follows the oracle"
                obs, _, terminated, truncated, _ = env.step(action)
                assert not (terminated or truncated), "a recorded step cannot follow the end of the episode"
    return negatives


def with_seed_base(rows: list[dict], seed: int) -> list[dict]:
    return [dict(r, _seed_base=seed) for r in rows]


# -- toy environment ---------------------------------------------------------------------------------------
def test_same_seed_gives_byte_identical_jsonl(tmp_path, toy_build):
    _, _, first = toy_build
    build_toy(tmp_path / "again")
    for name in DATASET_NAMES:
        a = (first / "line_world" / f"{name}.jsonl").read_bytes()
        b = (tmp_path / "again" / "line_world" / f"{name}.jsonl").read_bytes()
        assert a == b and len(a) > 0
    other, _ = generate_rows(toy_config(tmp_path, seed=4), env=LineWorldEnv(), reflector=LineWorldReflector())
    first_rows = [r for r in read_jsonl(first / "line_world" / "reflection.jsonl") if r["split"] == "train"]
    assert [r["seed"] for r in other["reflection"]["train"]] != [r["seed"] for r in first_rows]


def test_outputs_layout_columns_and_card(toy_build):
    _, result, root = toy_build
    out = root / "line_world"
    assert set(result) == set(DATASET_NAMES)
    for name in DATASET_NAMES:
        assert (out / name / "dataset_dict.json").is_file()
        assert set(result[name]) == {"train", "validation"}
        assert result[name]["train"].column_names == ["prompt", "completion", *METADATA_COLUMNS]
        lines = read_jsonl(out / f"{name}.jsonl")
        assert len(lines) == len(result[name]["train"]) + len(result[name]["validation"])
        assert list(lines[0])[0] == "split"
    card = (out / "README.md").read_text()
    assert "line_world" in card and "negative_prob" in card and "| reflection | train |" in card


def test_negative_examples_are_legal_non_oracle_non_terminal_and_name_the_recovery(toy_build):
    config, result, _ = toy_build
    env = LineWorldEnv()
    for split in ("train", "validation"):
        for name in ("reflection", "policy_reflect", "policy_plain"):
            rows = with_seed_base(result[name][split].to_list(), config.seed)
            replay_rows(env, rows)
        reflections = result["reflection"][split].to_list()
        negatives = [r for r in reflections if r["is_negative"]]
        assert negatives, "negative_prob=0.7 must inject mistakes"
        for row in negatives:
            mistake = ACTIONS[row["last_action_index"]]
            assert mistake not in (ACTIONS[JUMP],), "a mistake may not end the episode"
            assert f"{mistake.capitalize()} was a mistake." in row["completion"]
            assert ACTIONS[row["action_index"]] in row["completion"], "the reflection names the recovery"


def test_equally_good_alternatives_are_not_mistakes():
    env = LineWorldEnv()
    env.reset(task=Task("line_world", "t", "near", 0, {"start": 2, "goal": 6}))
    assert env.oracle_action() == RIGHT
    verified = candidate_mistakes(env, RIGHT, verify=True)
    assert WALK_RIGHT not in verified and JUMP not in verified
    assert STAY in verified
    assert WALK_RIGHT in candidate_mistakes(env, RIGHT, verify=False)


def test_reflection_targets_end_with_stop_marker_and_prompts_come_from_the_builder(toy_build):
    _, result, _ = toy_build
    for name in ("reflection", "reflection_positive"):
        for split in ("train", "validation"):
            for row in result[name][split]:
                assert row["completion"].endswith(STOP_MARKER)
                assert row["completion"].count(STOP_MARKER) == 1
                assert row["prompt"].startswith("Line world")
                assert row["prompt"] == reflection_prompt(row["prompt"].split("\n# Reflection:")[0])
    # The reflecting policy prompt is the reflection prompt + reflection + options.
    reflections = {(r["task_id"], r["step"]): r for r in result["reflection"]["train"]}
    for row in result["policy_reflect"]["train"]:
        ref = reflections[(row["task_id"], row["step"])]
        assert row["prompt"].startswith(ref["prompt"] + ref["completion"] + "\n")


def test_positive_datasets_have_no_negatives_and_cover_the_same_tasks(toy_build):
    _, result, _ = toy_build
    for split in ("train", "validation"):
        positive = result["reflection_positive"][split]
        mixed = result["reflection"][split]
        assert not any(positive["is_negative"])
        assert set(positive["task_id"]) == set(mixed["task_id"])
        assert len(result["policy_reflect_positive"][split]) == len(positive)
        assert len(mixed) > len(positive)  # recoveries lengthen the trajectories with mistakes


def test_no_negatives_when_negative_prob_is_zero(tmp_path):
    rows, stats = generate_rows(
        toy_config(tmp_path, negative_prob=0.0), env=LineWorldEnv(), reflector=LineWorldReflector()
    )
    assert stats.mistakes == 0
    assert not any(r["is_negative"] for r in rows["reflection"]["train"])
    assert rows["reflection"]["train"] == rows["reflection_positive"]["train"]


def test_shuffled_options_keep_the_label_on_the_oracle_action(tmp_path):
    config = toy_config(tmp_path, shuffle_options=True)
    generated, _ = generate_rows(config, env=LineWorldEnv(), reflector=LineWorldReflector())
    rows = generated["policy_reflect"]["train"]
    assert any(r["option_index"] != r["action_index"] for r in rows)
    replay_rows(LineWorldEnv(), with_seed_base(rows, config.seed), shuffled=True)


def test_card_says_whether_the_option_list_changes_between_prompts(toy_build, tmp_path):
    _, result, root = toy_build
    prompts = len(result["policy_reflect"]["train"]) + len(result["policy_reflect"]["validation"])
    fixed = (root / "line_world" / "README.md").read_text()
    assert (
        f"## Options\n\none option list over all {prompts} policy prompts (each move keeps its label)."
        in fixed
    )
    build_toy(tmp_path, shuffle_options=True)
    shuffled = (tmp_path / "line_world" / "README.md").read_text()
    assert re.search(
        r"\n(\d+) different option lists over \d+ policy prompts: the policy must find the move", shuffled
    )
    assert int(re.search(r"(\d+) different option lists", shuffled).group(1)) > 1


def test_custom_labels(tmp_path):
    config = toy_config(tmp_path, option_labels="12345")
    generated, _ = generate_rows(config, env=LineWorldEnv(), reflector=LineWorldReflector())
    row = generated["policy_plain"]["train"][0]
    assert row["completion"] == "12345"[row["option_index"]]
    assert "\n1. go left\n" in row["prompt"]
    assert (
        row["prompt"]
        == build_prompt(row["prompt"].split("\n# Options:")[0], ACTIONS, None, labels="12345").text
    )


def test_the_labels_used_are_recorded_next_to_the_data(toy_build, tmp_path):
    _, _, root = toy_build
    assert read_option_labels(root / "line_world") == DEFAULT_LABELS
    config, result = build_toy(tmp_path, option_labels="p, q, r, s, t", n_train_tasks=2, n_val_tasks=1)
    assert config.labels == ("p", "q", "r", "s", "t")
    assert read_option_labels(tmp_path / "line_world") == config.labels
    row = result["policy_reflect"]["train"][0]
    assert row["completion"] == config.labels[row["option_index"]] and "\np. go left\n" in row["prompt"]
    with pytest.raises(ValueError, match="distinct"):
        toy_config(tmp_path, option_labels="AAB")


def test_train_and_validation_tasks_are_disjoint(toy_build):
    _, result, _ = toy_build
    train = set(result["reflection"]["train"]["seed"])
    validation = set(result["reflection"]["validation"]["seed"])
    assert train and validation and not train & validation


def test_config_validation():
    with pytest.raises(ValueError, match="negative_prob"):
        DataBuilderConfig(negative_prob=1.5)
    with pytest.raises(ValueError, match="env_kwargs"):
        DataBuilderConfig(env_kwargs="{not json")
    assert DataBuilderConfig(env_kwargs='{"horizon": 12}').env_kwargs == {"horizon": 12}


def test_refuses_to_overwrite_foreign_directories(tmp_path):
    (tmp_path / "line_world" / "reflection").mkdir(parents=True)
    (tmp_path / "line_world" / "reflection" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a saved data set"):
        build_toy(tmp_path)


# -- DangerousTaxi -----------------------------------------------------------------------------------------
def test_taxi_data_replays_and_negatives_name_the_recovery(tmp_path):
    config = DataBuilderConfig(
        env_name="taxi",
        n_train_tasks=6,
        n_val_tasks=2,
        negative_prob=1.0,
        seed=1,
        output_dir=str(tmp_path),
        progress=False,
    )
    result = build_datasets(config)
    env = make_env("taxi")
    for split in ("train", "validation"):
        rows = with_seed_base(result["policy_reflect"][split].to_list(), config.seed)
        assert replay_rows(env, rows) > 0
        reflections = result["reflection"][split].to_list()
        assert all(row["completion"].endswith(STOP_MARKER) for row in reflections)
        negatives = [row for row in reflections if row["is_negative"]]
        assert negatives, "negative_prob=1 injects a mistake into every trajectory that has one"
        for row in negatives:
            assert row["action_text"] in row["completion"], "a negative example names the recovery action"
    assert set(result["reflection"]["train"]["difficulty"]) == set(env.stages)


def test_cli_reads_yaml_and_overrides(tmp_path):
    recipe = tmp_path / "data.yaml"
    recipe.write_text(
        f"env_name: taxi\nn_train_tasks: 2\nn_val_tasks: 1\nstages: [pickup]\noutput_dir: {tmp_path}\nprogress: false\n"
    )
    assert build_datasets_cli(["--config", str(recipe), "--seed", "5", "--env", "taxi"]) == 0
    card = (tmp_path / "taxi" / "README.md").read_text()
    assert '"seed": 5' in card
    rows = read_jsonl(tmp_path / "taxi" / "policy_plain.jsonl")
    assert {r["difficulty"] for r in rows} == {"pickup"}
    assert {r["split"] for r in rows} == {"train", "validation"}
    assert rows[0]["env"] == "taxi"


def test_card_reports_reflection_lengths_in_characters_or_tokens(tmp_path, toy_build, tiny_model_dir):
    from reflect_trl.models import load_tokenizer

    _, result, root = toy_build
    card = (root / "line_world" / "README.md").read_text()
    longest = max(
        len(r) for split in ("train", "validation") for r in result["reflection"][split]["completion"]
    )
    assert "## Lengths" in card and "In characters" in card
    assert f"| reflection target (stop marker included) | {longest} |" in card
    assert "`reflect-trl data --tokenizer_name_or_path <your model>` counts them" in card

    _, counted = build_toy(tmp_path, tokenizer_name_or_path=tiny_model_dir)
    tokenizer = load_tokenizer(tiny_model_dir)
    targets = [r for split in ("train", "validation") for r in counted["reflection"][split]["completion"]]
    tokens = max(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in targets)
    card = (tmp_path / "line_world" / "README.md").read_text()
    assert f"In tokens of `{tiny_model_dir}`" in card
    assert f"| reflection target (stop marker included) | {tokens} |" in card
    assert f"`reflection_max_new_tokens` (SFT evaluation, RL, eval) must be at least {tokens}" in card


def test_cli_prints_the_reflection_budget(tmp_path, tiny_model_dir, capsys):
    argv = ["--env_name", "taxi", "--n_train_tasks", "2", "--n_val_tasks", "1", "--stages", "pickup"]
    argv += ["--output_dir", str(tmp_path), "--progress", "false", "--tokenizer_name_or_path", tiny_model_dir]
    assert build_datasets_cli(argv) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("longest reflection ") and "set reflection_max_new_tokens >= " in last
    with pytest.raises(Exception, match="tokenizer_name_or_path 'nowhere/at/all' does not exist"):
        build_datasets_cli([*argv[:-1], "nowhere/at/all"])


def test_the_reference_codes_taxi_data_executed_random_actions_as_targets():
    """random_action_prob 0.9 + policy_targets 'executed' (the paper protocol): trajectories mostly take random
    actions, every reflection still names the oracle's move, and the policy target is the executed action."""
    from reflect_trl.data.builder import DataBuilderConfig, generate_rows

    config = DataBuilderConfig(
        env_name="taxi", n_train_tasks=30, n_val_tasks=0, random_action_prob=0.9, policy_targets="executed",
        progress=False,
    )  # fmt: skip
    rows, stats = generate_rows(config)
    policy = rows["policy_reflect"]["train"]
    reflections = rows["reflection"]["train"]
    executed_is_oracle = [r["option_index"] == r["action_index"] for r in policy]
    assert 0.05 < sum(executed_is_oracle) / len(policy) < 0.5, (
        "mostly random targets (1/6 + 0.1 match by chance)"
    )
    naming = sum(r["action_text"] in r["completion"] for r in reflections) / len(reflections)
    assert naming > 0.9, "the reflections name the oracle's move, whatever was executed"
    assert stats.mistakes > 0
    oracle = generate_rows(
        DataBuilderConfig(env_name="taxi", n_train_tasks=30, n_val_tasks=0, progress=False)
    )[0]
    assert all(r["option_index"] == r["action_index"] for r in oracle["policy_reflect"]["train"])
    with pytest.raises(ValueError, match="policy_targets='greedy'"):
        DataBuilderConfig(policy_targets="greedy")
