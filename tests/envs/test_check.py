"""The environment contract checker (``reflect_trl.envs.check``, ``reflect-trl check-env``): a good environment passes,
and each broken variant fails the check it breaks, saying where."""

from __future__ import annotations

import hashlib
import random
import re
from pathlib import Path

import pytest

import reflect_trl.envs
from _toy_env import LineWorldEnv, LineWorldReflector
from reflect_trl.envs import SPLITS, Observation, StepResult, Task, TextEnv, split_seed
from reflect_trl.envs.check import (
    FAIL,
    INFO,
    OPTION_LOOKUP_STUDY,
    PASS,
    RANDOM_TOO_EASY,
    SKIP,
    WARN,
    EnvContractError,
    check_env_contract,
)
from reflect_trl.reflection import ReflectionContext

ACTIONS = ("step left", "step right", "wait")
LEFT, RIGHT, WAIT = range(3)
STAGES = ("near", "far")


def split_of(start: int, goal: int) -> str:
    bucket = hashlib.sha256(f"{start}/{goal}".encode()).digest()[0] % 10
    return "train" if bucket < 8 else ("validation" if bucket == 8 else "test")


class Walk(TextEnv):
    """Walk from a start cell to a goal cell on 0..29; splits by a hash of (start, goal)."""

    name = "walk"
    stages = STAGES

    def __init__(self, horizon: int = 12) -> None:
        super().__init__(horizon)
        self.position = self.goal = 0

    def make_tasks(self, split: str, n: int, seed: int = 0, difficulty: str | None = None) -> list[Task]:
        if split not in SPLITS:
            raise ValueError(f"walk: unknown split {split!r}")
        tasks = []
        for i in range(n):
            stage = self.check_difficulty(difficulty) if difficulty else self.stages[i % 2]
            rng = random.Random(task_seed := split_seed(seed, split, i))
            while True:
                start = rng.randrange(30)
                goal = start + rng.choice([-1, 1]) * (
                    rng.randint(1, 3) if stage == "near" else rng.randint(4, 8)
                )
                if 0 <= goal < 30 and split_of(start, goal) == split:
                    break
            tasks.append(
                Task(self.name, f"walk-{split}-{stage}-{i}", stage, task_seed, self.task_data(start, goal))
            )
        return tasks

    def task_data(self, start: int, goal: int) -> dict:
        return {"start": start, "goal": goal}

    def instance_key(self, task: Task) -> str:
        return f"{task.difficulty}:{task.data['start']}->{task.data['goal']}"

    def reset(self, seed: int | None = None, task: Task | None = None) -> Observation:
        assert task is not None
        self.task, self.t, self.done = task, 0, False
        self.position, self.goal = int(task.data["start"]), int(task.data["goal"])
        self.observation = self.observe()
        return self.observation

    def observe(self) -> Observation:
        return Observation(f"You are on cell {self.position}; the goal is cell {self.goal}.", ACTIONS)

    def step(self, action_index: int) -> StepResult:
        action = self._check_action(action_index)
        self.t += 1
        self.position = min(29, max(0, self.position + {LEFT: -1, RIGHT: 1, WAIT: 0}[action]))
        success = self.position == self.goal
        truncated = not success and self.t >= self.horizon
        self.done = success or truncated
        self.observation = self.observe()
        return self.observation, float(success), success, truncated, self.info(success)

    def info(self, success: bool) -> dict:
        return {"success": success}

    def oracle_action(self) -> int:
        return RIGHT if self.goal > self.position else LEFT

    def state_key(self):
        return (self.position, self.goal)


class WalkReflector:
    def reflect(self, ctx: ReflectionContext, rng: random.Random) -> str:
        opener = rng.choice(["Next", "Now"])
        return f"{opener} I {ctx.oracle_action_text}: the goal is cell {ctx.env.goal}."


def check(env=Walk, reflector=None, **kwargs):
    return check_env_contract(env, reflector=reflector or WalkReflector(), n_tasks=8, **kwargs)


def statuses(report) -> dict[str, str]:
    return {c.name: c.status for c in report.checks}


def detail(report, name: str) -> str:
    return next(c.detail for c in report.checks if c.name == name)


def test_a_good_environment_passes_every_check():
    report = check()
    assert set(statuses(report).values()) == {PASS}, report.lines()
    report.raise_for_failures(strict=True)
    assert report.facts["oracle_steps"][0] >= 1 and report.facts["max_options"] == 3
    assert "longest reflection" in detail(report, "prompt budget")
    assert len(report.lines()) == 16 and report.lines()[0].startswith("PASS  class")
    assert "reflection_reward 'verified' available" in detail(report, "verified reward")
    assert "in fresh processes with PYTHONHASHSEED=1, 2" in detail(report, "options")
    near = report.facts["random_success"]["near"]
    assert 0 < near < RANDOM_TOO_EASY and f"near {near:.0%}" in detail(report, "random policy")


def test_the_shipped_environments_keep_the_contract(monkeypatch):
    from _plugins import EXAMPLE_SRC

    monkeypatch.syspath_prepend(str(EXAMPLE_SRC))
    from reflect_lock_puzzle.env import LockPuzzleEnv
    from reflect_lock_puzzle.reflector import LockPuzzleOracleReflector

    check_env_contract(LockPuzzleEnv, reflector=LockPuzzleOracleReflector(), n_tasks=10).raise_for_failures(
        strict=True
    )
    taxi = check_env_contract("taxi", n_tasks=10)
    assert taxi.ok, taxi.lines()
    assert statuses(taxi)["disjoint splits"] == WARN and "taxi's dropoff" in detail(taxi, "disjoint splits")
    assert {statuses(taxi)[name] for name in ("options", INFO, "random policy")} == {PASS}, taxi.lines()
    assert taxi.facts["distinct_option_lists"] == 1  # six moves, always in the same order


class NoSuperInit(Walk):
    def __init__(self, horizon: int = 12) -> None:  # forgets super().__init__(horizon)
        self.position = self.goal = 0


class OracleLosesFar(Walk):
    def oracle_action(self) -> int:
        if self.task.difficulty == "far" and self.task.task_id.startswith("walk-test"):
            return WAIT
        return super().oracle_action()


class UnseededTasks(Walk):
    def make_tasks(self, split, n, seed=0, difficulty=None):
        tasks = super().make_tasks(split, n, seed, difficulty)
        return [Task(t.env, t.task_id, t.difficulty, random.randrange(10**6), t.data) for t in tasks]


class TupleData(Walk):
    def task_data(self, start, goal):
        return {"cells": {start, goal}, "start": start, "goal": goal}  # a set: not JSON


class NoSuccessInfo(Walk):
    def info(self, success):
        return {"won": success}


class SuccessOnlyAtTheEnd(Walk):  # the guide asks for info["success"] on every step
    def info(self, success):
        return {"success": success, "moves": self.t} if self.done else {"moves": self.t}


class ReorderedOptions(Walk):
    """Offers the actions in the order ``options()`` gives; step and oracle go by the action texts."""

    def options(self) -> tuple[str, ...]:
        return ACTIONS

    def observe(self):
        return Observation(super().observe().text, self.options())

    def step(self, action_index):
        i = self._check_action(action_index)
        return super().step(ACTIONS.index(self.observation.actions[i]))

    def oracle_action(self):
        return self.observation.actions.index(ACTIONS[super().oracle_action()])


class RotatingOptions(ReorderedOptions):  # the order depends on how many episodes this instance has played
    def reset(self, seed=None, task=None):
        self.episodes = getattr(self, "episodes", 0) + 1
        return super().reset(seed, task)

    def options(self):
        k = self.episodes % len(ACTIONS)
        return ACTIONS[k:] + ACTIONS[:k]


class FlickeringOptions(ReorderedOptions):  # "wait" is offered in every other episode of an instance
    def reset(self, seed=None, task=None):
        self.episodes = getattr(self, "episodes", 0) + 1
        return super().reset(seed, task)

    def options(self):
        return ACTIONS if self.episodes % 2 else ACTIONS[:2]


class SetOrderedOptions(ReorderedOptions):  # the same order within a process, another one in the next process
    def options(self):
        return tuple({*ACTIONS})


class ParityOptions(ReorderedOptions):  # "wait" only on even cells: the option list changes with the state
    def options(self):
        return ACTIONS if self.position % 2 == 0 else ACTIONS[:2]


class SplitBlind(Walk):  # every split gets the train tasks under its own ids: test = train
    def make_tasks(self, split, n, seed=0, difficulty=None):
        if split not in SPLITS:
            raise ValueError(split)
        return [
            Task(t.env, t.task_id.replace("-train-", f"-{split}-"), t.difficulty, t.seed, t.data)
            for t in super().make_tasks("train", n, seed, difficulty)
        ]


class EveryActionHelps(Walk):  # whatever the agent picks, it walks towards the goal: random play wins
    def step(self, action_index):
        self._check_action(action_index)
        return super().step(self.oracle_action())


class StepCounterKey(Walk):
    def state_key(self):
        return (self.position, self.goal, self.t)


class AliasedKey(Walk):
    def state_key(self):
        return self.position % 3  # cells 2 and 5 share a key, but not a future


class SilentReflector:
    def reflect(self, ctx, rng):
        return "Keep going."


class TooManyActions(Walk):
    def observe(self):
        return Observation(f"cell {self.position}, goal {self.goal}", ACTIONS)


class OptimalWithoutTheOracle(Walk):  # optimal_actions() forgets the oracle's move
    def optimal_actions(self):
        return frozenset({(self.oracle_action() + 1) % 3})


class OptimalOutOfRange(Walk):
    def optimal_actions(self):
        return frozenset({self.oracle_action(), 7})


class NoOptimalActions(Walk):
    def optimal_actions(self):
        raise NotImplementedError


@pytest.mark.parametrize(
    ("env", "reflector", "kwargs", "failed", "words"),
    [
        (NoSuperInit, None, {}, "class", "call super().__init__(horizon)"),
        (OracleLosesFar, None, {}, "oracle", "the oracle fails task 'walk-test-far-0' (test, far)"),
        (UnseededTasks, None, {}, "deterministic", "differs on a second call"),
        (TupleData, None, {}, "json", "task.data is not JSON-serialisable"),
        (
            NoSuccessInfo,
            None,
            {},
            INFO,
            "step 0 of an oracle-led episode: info has no \"success\" (keys present: ['won'])",
        ),
        (
            SuccessOnlyAtTheEnd,
            None,
            {},
            INFO,
            "(train, far), step 0 of an oracle-led episode: info has no \"success\" (keys present: ['moves'])",
        ),
        (SplitBlind, None, {}, "disjoint splits", "every problem of test also appears in train"),
        (AliasedKey, None, {}, "state_key", "have equal keys but"),
        (Walk, SilentReflector(), {}, "reflector", "does not name the oracle's action by its exact text"),
        (TooManyActions, None, {"labels": ("A", "B")}, "prompt budget", "offers 3 actions, more than the 2"),
        (
            OptimalWithoutTheOracle,
            None,
            {},
            "verified reward",
            "the oracle's action must be one of the optimal ones",
        ),
        (OptimalOutOfRange, None, {}, "verified reward", "indices of the 3 legal actions"),
    ],
)
def test_a_broken_environment_fails_the_check_it_breaks(env, reflector, kwargs, failed, words):
    report = check(env, reflector, **kwargs)
    assert statuses(report)[failed] == FAIL, report.lines()
    assert words in detail(report, failed)
    assert [c.name for c in report.failures] == [failed], report.lines()
    with pytest.raises(EnvContractError, match=re.escape(failed)):
        report.raise_for_failures()


@pytest.mark.parametrize(
    ("env", "words"),
    [
        (
            RotatingOptions,
            "at step 0 differ in order between two resets of the same task: ['step right', 'wait', 'step left'] vs "
            "['wait', 'step left', 'step right']; options must not depend on set/dict iteration order or an unseeded RNG",
        ),
        (
            FlickeringOptions,
            "at step 0 differ between two resets of the same task: ['step left', 'step right', 'wait'] vs",
        ),
        (SetOrderedOptions, "differ in order between this process and a fresh one with PYTHONHASHSEED="),
    ],
)
def test_options_that_change_order_between_replays_of_one_state_fail(env, words):
    report = check(env)
    assert statuses(report)["options"] == FAIL, report.lines()
    assert words in detail(report, "options")
    assert "task 'walk-train-near-0' (train, near)" in detail(report, "options")


def test_the_options_check_says_whether_a_policy_must_look_its_option_up_in_context():
    fixed, varying = check(), check(ParityOptions)
    assert fixed.facts["distinct_option_lists"] == 1
    assert re.search(
        r"one option list over all \d+ decision points \(each move keeps its label\)",
        detail(fixed, "options"),
    )
    assert statuses(varying)["options"] == PASS, varying.lines()
    assert varying.facts["distinct_option_lists"] == 2
    text = detail(varying, "options")
    assert re.search(
        r"2 different option lists over \d+ decision points: the policy must find the move", text
    )
    assert (
        "which the tiny self-built models learned only after an SFT warm-up on `reflect-trl lookup-data`"
        in text
    )
    assert (Path(__file__).parents[2] / OPTION_LOOKUP_STUDY).is_file()


def test_options_stay_in_process_for_a_class_a_fresh_process_cannot_import():
    class Local(Walk):
        pass

    report = check(Local, hash_seeds=(1,))
    assert statuses(report)["options"] == PASS
    assert "not replayed in other processes (the class is not importable" in detail(report, "options")


def test_a_random_policy_that_wins_warns_that_the_environment_is_too_easy():
    report = check(EveryActionHelps)
    assert statuses(report)["random policy"] == WARN, report.lines()
    assert report.facts["random_success"] == {"near": 1.0, "far": 1.0}
    assert detail(report, "random policy").startswith("solves near 100%, far 100% of 50 test tasks per stage")
    assert "at or above 75%, too easy to show what a trained policy learns" in detail(report, "random policy")
    few = check(EveryActionHelps, random_episodes=4, random_threshold=1.01)
    assert statuses(few)["random policy"] == PASS and "of 4 test tasks" in detail(few, "random policy")
    assert statuses(check(random_episodes=0))["random policy"] == SKIP


def test_a_key_with_the_step_counter_never_matches_across_routes():
    report = check(StepCounterKey)
    assert statuses(report)["state_key"] == WARN
    assert "does the key hold the step counter?" in detail(report, "state_key")


class HistoryKey(Walk):
    def reset(self, seed=None, task=None):
        self.moves = ()
        return super().reset(seed, task)

    def step(self, action_index):
        self.moves += (action_index,)
        return super().step(action_index)

    def state_key(self):
        return (self.position, self.goal, self.moves)


def test_a_key_with_the_history_never_matches_across_routes():
    report = check(HistoryKey)
    assert statuses(report)["state_key"] == WARN
    assert "the key holds the history or the step counter" in detail(report, "state_key")


def test_repeated_problems_need_an_instance_key_and_overlapping_splits_warn():
    report = check_env_contract(LineWorldEnv, reflector=LineWorldReflector(), n_tasks=10)
    found = statuses(report)
    assert found["instance_key"] == FAIL and "instance_key is the default (task_id)" in detail(
        report, "instance_key"
    )
    assert found["disjoint splits"] == WARN and "also appear in test" in detail(report, "disjoint splits")
    assert found["state_key"] == SKIP and "gigpo" in detail(report, "state_key")
    assert found["make_tasks"] == WARN  # an unknown difficulty gives tasks instead of an error


def test_later_checks_are_skipped_when_what_they_need_failed():
    report = check(NoSuperInit)
    assert [c.status for c in report.checks[1:]] == [SKIP] * 15


def test_the_cli_prints_one_line_per_check_and_fails_with_status_1(monkeypatch, capsys):
    from reflect_trl.cli import main
    from reflect_trl.reflection import _ORACLE_REFLECTORS

    monkeypatch.setitem(reflect_trl.envs._REGISTRY, "line_world", "_toy_env:LineWorldEnv")
    monkeypatch.setitem(_ORACLE_REFLECTORS, "line_world", "_toy_env:LineWorldReflector")
    assert main(["check-env", "line_world", "--tasks", "5"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 17 and out[-1].startswith("line_world: 16 checks, 1 failed")
    assert any(line.startswith("FAIL  instance_key") for line in out)
    assert main(["check-env", "taxi", "--stages", "pickup", "--tasks", "4", "--random_episodes", "7"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].endswith("the contract holds")
    assert any(line.startswith("PASS  random policy    solves pickup 0% of 7 test tasks") for line in out), (
        out
    )
    assert main(["check-env", "taxi", "--random_episodes", "-1"]) == 2
    assert "--random_episodes -1: must be >= 0" in capsys.readouterr().err
    assert main(["check-env", "line_wrld"]) == 2
    assert "did you mean 'line_world'?" in capsys.readouterr().err


def test_an_environment_without_optimal_actions_says_verified_is_unavailable():
    report = check(NoOptimalActions)
    assert statuses(report)["verified reward"] == SKIP
    assert "reflection_reward 'verified' / 'mixed'" in detail(report, "verified reward")
    assert not report.failures, report.lines()
