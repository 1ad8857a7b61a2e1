"""A tiny TextEnv + reflector used by the data-builder and SFT tests (no dependency on the real environments).

LineWorld: the agent walks on cells 0..8 towards a goal cell. Actions (always all offered):
``go left``, ``go right``, ``walk right`` (same effect as ``go right``: an equally good alternative that must
never be injected as a mistake), ``stay put`` (legal, harmless, one step wasted), ``jump off`` (ends the
episode in failure). Reaching the goal ends the episode with success.
"""

from __future__ import annotations

import random

from reflect_trl.envs import SPLITS, Observation, StepResult, Task, TextEnv, split_seed
from reflect_trl.reflection import ReflectionContext

ACTIONS = ("go left", "go right", "walk right", "stay put", "jump off")
LEFT, RIGHT, WALK_RIGHT, STAY, JUMP = range(5)


class LineWorldEnv(TextEnv):
    name = "line_world"
    stages = ("near", "far")

    def __init__(self, horizon: int = 10) -> None:
        super().__init__(horizon)
        self.position = 0
        self.goal = 0
        self.success = False

    def make_tasks(self, split: str, n: int, seed: int = 0, difficulty: str | None = None) -> list[Task]:
        if split not in SPLITS:
            raise ValueError(split)
        tasks = []
        for i in range(n):
            level = difficulty or self.stages[i % 2]
            task_seed = split_seed(seed, split, i)
            rng = random.Random(task_seed)
            start = rng.randrange(0, 9)
            distance = 2 if level == "near" else 4
            goal = start + distance if start + distance <= 8 else start - distance
            data = {"start": start, "goal": goal}
            tasks.append(Task(self.name, f"line-{split}-{level}-{i}", level, task_seed, data))
        return tasks

    def reset(self, seed: int | None = None, task: Task | None = None) -> Observation:
        assert task is not None
        self.task = task
        self.position, self.goal = int(task.data["start"]), int(task.data["goal"])
        self.t, self.done, self.success = 0, False, False
        self.observation = self._observe()
        return self.observation

    def _observe(self) -> Observation:
        text = f"Line world, cells 0 to 8. You stand on cell {self.position}. The goal is cell {self.goal}."
        return Observation(text, ACTIONS)

    def step(self, action_index: int) -> StepResult:
        action = self._check_action(action_index)
        self.t += 1
        terminated = False
        if action == JUMP:
            terminated = True
        elif action == LEFT:
            self.position = max(0, self.position - 1)
        elif action in (RIGHT, WALK_RIGHT):
            self.position = min(8, self.position + 1)
        if self.position == self.goal and action != JUMP:
            self.success = terminated = True
        truncated = not terminated and self.t >= self.horizon
        self.done = terminated or truncated
        self.observation = self._observe()
        reward = 1.0 if self.success else -0.1
        return self.observation, reward, terminated, truncated, {"success": self.success}

    def oracle_action(self) -> int:
        return RIGHT if self.goal > self.position else LEFT


class LineWorldReflector:
    """Names the last action's quality and the next (oracle) action by its exact text."""

    def reflect(self, ctx: ReflectionContext, rng: random.Random) -> str:
        parts = []
        if ctx.last_action is not None:
            if ctx.last_action_was_oracle:
                parts.append(f"{ctx.last_action.capitalize()} was right.")
            else:
                parts.append(f"{ctx.last_action.capitalize()} was a mistake.")
        env = ctx.env
        side = "right" if env.goal > env.position else "left"
        opener = rng.choice(["Next", "Now"])
        parts.append(f"{opener} I {ctx.oracle_action_text}, the goal is to the {side}.")
        return " ".join(parts)


def toy_prompts(n_tasks: int = 12) -> list[str]:
    """Prompt texts of the toy data (to train a tiny tokenizer on)."""
    from reflect_trl.prompts import build_prompt, reflection_prompt, with_stop

    env, reflector, rng = LineWorldEnv(), LineWorldReflector(), random.Random(0)
    texts = []
    for split in ("train", "validation"):
        for task in env.make_tasks(split, n_tasks):
            obs = env.reset(task=task)
            last = None
            while True:
                ctx = ReflectionContext(env, obs, env.t, env.oracle_action(), None, last, True)
                reflection = reflector.reflect(ctx, rng)
                texts.append(reflection_prompt(obs.text) + with_stop(reflection))
                texts.append(build_prompt(obs.text, obs.actions, reflection).text + "A")
                texts.append(build_prompt(obs.text, obs.actions, None).text + "B")
                for action in (STAY, LEFT):
                    texts.append(f"{ACTIONS[action].capitalize()} was a mistake.")
                action = env.oracle_action()
                last = ACTIONS[action]
                obs, _, terminated, truncated, _ = env.step(action)
                if terminated or truncated:
                    break
    return texts
