"""Option pruning of the text-game environments never looks at the plan (no oracle leak).

A scripted engine whose walkthrough needs ``examine note`` while the environment excludes ``examine``: the prompt
offers no ``examine`` at all (it used to offer exactly the one the plan needed), the oracle is unavailable in that
state, and data generation skips the task and counts it."""

from __future__ import annotations

import random
from typing import Any

import pytest

from reflect_trl.data.builder import DataBuilderConfig, generate_rows
from reflect_trl.envs import OracleUnavailableError, Task
from reflect_trl.envs.textgame import TextGameEnv

#: state name -> (admissible commands, the plan from there, next state per command)
SCRIPT = {
    "start": (
        ["examine note", "examine door", "go east", "look"],
        ["examine note", "go east"],
        {"examine note": "read"},
    ),
    "read": (["examine door", "go east", "look"], ["go east"], {"go east": "won"}),
}


class _Engine:
    def reset(self) -> dict[str, Any]:
        self.current = "start"
        return self._state("start")

    def _state(self, name: str, won: bool = False) -> dict[str, Any]:
        commands, plan, _ = SCRIPT.get(name, ([], [], {}))
        return {"name": name, "admissible_commands": commands, "plan": plan, "won": won, "max_score": 1}

    def step(self, command: str):
        _, _, moves = SCRIPT[self.current]
        target = moves.get(command, "start")
        self.current = target
        won = target == "won"
        return self._state(target, won), (1 if won else 0), won

    def close(self) -> None:
        pass


class ScriptedGame(TextGameEnv):
    name = "scripted_game"
    stages = ("easy",)

    def make_tasks(self, split: str, n: int, seed: int = 0, difficulty: str | None = None) -> list[Task]:
        return [Task(self.name, f"{split}-{i}", "easy", seed + i) for i in range(n)]

    def _task_for_seed(self, seed: int) -> Task:
        return Task(self.name, f"seed-{seed}", "easy", seed)

    def _game_file_for(self, task: Task) -> str:
        return "scripted"

    def _start_engine(self, game_file: str) -> Any:
        return _Engine()

    def _plan_of(self, state: Any) -> list[str]:
        return list(state["plan"])

    def _render(self) -> str:
        return f"You are in the {self.state['name']} room."


class _NamingReflector:
    def reflect(self, ctx, rng: random.Random) -> str:
        return f"Next: {ctx.observation.actions[ctx.oracle_action]}."


def test_an_excluded_plan_command_is_not_offered_and_the_oracle_says_so():
    env = ScriptedGame(exclude_commands=["examine"])
    obs = env.reset(task=env.make_tasks("train", 1)[0])
    assert obs.actions == ("go east", "look"), "no examine at all: the plan's one is pruned like the others"
    with pytest.raises(OracleUnavailableError, match="'examine note'.*exclude_commands"):
        env.oracle_action()
    plain = ScriptedGame()
    plain.reset(task=plain.make_tasks("train", 1)[0])
    assert plain.observation.actions[plain.oracle_action()] == "examine note"


def test_a_cap_that_prunes_the_plan_command_does_the_same():
    env = ScriptedGame(max_options=2)  # examine ... and look go first, then the alphabetically last
    obs = env.reset(task=env.make_tasks("train", 1)[0])
    assert "examine note" not in obs.actions and len(obs.actions) == 2
    with pytest.raises(OracleUnavailableError):
        env.oracle_action()


def test_data_generation_skips_the_tasks_the_settings_make_unsolvable_and_counts_them(tmp_path):
    config = DataBuilderConfig(
        env_name="scripted_game", n_train_tasks=3, n_val_tasks=2, negative_prob=0.0, progress=False
    )
    rows, stats = generate_rows(config, ScriptedGame(exclude_commands=["examine"]), _NamingReflector())
    assert all(not r for d in rows.values() for r in d.values())
    assert dict(stats.unsolvable) == {("train", "easy"): 3, ("validation", "easy"): 2}
    rows, stats = generate_rows(config, ScriptedGame(), _NamingReflector())
    assert not stats.unsolvable and len(rows["policy_reflect"]["train"]) == 3 * 2  # two decisions per task
