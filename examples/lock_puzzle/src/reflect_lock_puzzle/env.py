"""LockPuzzle: set the dials of a combination lock to its code, then open it.

The lock has three dials, each showing a digit from 0 to 4, and a code of three digits. One dial is *selected*
(dial 1 at the start). The four actions are always offered:

* ``turn the dial up`` / ``turn the dial down``: the selected dial moves one step (a dial at 4 or 0 does not move
  further: the step is wasted);
* ``select the next dial``: dial 1 -> 2 -> 3 -> 1;
* ``open the lock``: ends the episode -- success when every dial shows the code, otherwise the lock jams (a
  failure, reported as ``info["crash"]``).

The observation shows the last move, every dial and the code, the selected dial and how many dials are right.

* **Stages** (a task's ``difficulty``): ``one_dial``, ``two_dials``, ``three_dials`` -- how many dials start off
  the code, each by one or two steps. The shortest solution takes 2 to 9 actions; the default horizon is 12.
* **Splits**: a task's start and code are drawn from its seed (:func:`reflect_trl.envs.split_seed`) until the
  pair falls into its split's share of all pairs (a stable hash: 80 % train, 10 % validation, 10 % test), so a
  ``test`` puzzle never appears in ``train``.
* **Oracle** (optimal): turn the selected dial toward its code digit; when it is right, open the lock if every
  dial is right, else select the next dial.
* **Instances**: a task's puzzle is its stage, start and code (:meth:`LockPuzzleEnv.instance_key`); held-out tasks
  can repeat a puzzle, and evaluation counts each puzzle once in its intervals.
* **Markov state**: the dials, the code and the selected dial. The observation also names the last move (so that a
  reflection can judge it), which is not part of the state: it changes nothing that any action leads to.
* **Rewards**: ``success_reward`` (1) for opening; ``jam_reward`` (0) and ``step_reward`` (0) otherwise. A penalty
  for a jam would make never opening the lock (0 at the horizon) look better than trying.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from reflect_trl.envs import SPLITS, Observation, StepResult, Task, TextEnv, split_seed

NUM_DIALS = 3
LOWEST, HIGHEST = 0, 4
#: The actions, always all offered, in this order.
ACTIONS: tuple[str, ...] = ("turn the dial up", "turn the dial down", "select the next dial", "open the lock")
UP, DOWN, NEXT, OPEN = range(len(ACTIONS))
STAGES: tuple[str, ...] = ("one_dial", "two_dials", "three_dials")
#: Share of all (start, code) pairs that belongs to each split, out of 10 hash buckets.
SPLIT_BUCKETS: dict[str, range] = {"train": range(0, 8), "validation": range(8, 9), "test": range(9, 10)}
RULES = (
    f"Lock puzzle: set all {NUM_DIALS} dials to the code, then open the lock. Only the selected dial turns; "
    f"digits go from {LOWEST} to {HIGHEST}. Opening with a wrong dial jams the lock."
)

Dials = tuple[int, ...]


def distance(dials: Dials, code: Dials) -> int:
    """Turns still needed to reach the code."""
    return sum(abs(d - c) for d, c in zip(dials, code, strict=True))


def right_dials(dials: Dials, code: Dials) -> int:
    return sum(d == c for d, c in zip(dials, code, strict=True))


def split_of(start: Dials, code: Dials) -> str:
    """The split a (start, code) pair belongs to (a stable hash, the same on every machine)."""
    bucket = hashlib.sha256(f"{start}/{code}".encode()).digest()[0] % 10
    return next(split for split, buckets in SPLIT_BUCKETS.items() if bucket in buckets)


def draw_puzzle(rng: random.Random, stage: str, split: str) -> tuple[Dials, Dials]:
    """A (start, code) pair of ``stage`` in ``split``: ``k`` dials off the code by one or two steps."""
    wrong = STAGES.index(stage) + 1
    while True:
        code = tuple(rng.randint(LOWEST, HIGHEST) for _ in range(NUM_DIALS))
        start = list(code)
        for dial in rng.sample(range(NUM_DIALS), wrong):
            offsets = [o for o in (-2, -1, 1, 2) if LOWEST <= code[dial] + o <= HIGHEST]
            start[dial] = code[dial] + rng.choice(offsets)
        if split_of(tuple(start), code) == split:
            return tuple(start), code


def shortest_steps(dials: Dials, code: Dials, selected: int = 0) -> int:
    """Actions of the oracle's (optimal) solution: every turn, the selections up to the last wrong dial, open."""
    wrong = [(i - selected) % NUM_DIALS for i in range(NUM_DIALS) if dials[i] != code[i]]
    return distance(dials, code) + (max(wrong) if wrong else 0) + 1


def describe_move(action: int | None, dials: Dials, selected: int, stuck: bool) -> str:
    """The "Last move" line: what the last action did (``dials``/``selected`` after it)."""
    if action is None:
        return "none"
    if action == NEXT:
        return f"selected dial {selected + 1}"
    if action == OPEN:
        return "opened the lock"
    way = "up" if action == UP else "down"
    if stuck:
        return f"dial {selected + 1} could not go {way} from {dials[selected]}"
    return f"dial {selected + 1} went {way} to {dials[selected]}"


def render(dials: Dials, code: Dials, selected: int, last_move: str = "none") -> str:
    """The observation text (the prompt builder adds the options)."""
    return "\n".join(
        [
            RULES,
            f"Last move: {last_move}.",
            f"Dials: {' '.join(map(str, dials))}. Code: {' '.join(map(str, code))}.",
            f"Selected: dial {selected + 1}, showing {dials[selected]}, code digit {code[selected]}.",
            f"Right dials: {right_dials(dials, code)} of {NUM_DIALS}.",
        ]
    )


class LockPuzzleEnv(TextEnv):
    """A three-dial combination lock as a text game; see the module docstring for the rules."""

    name = "lock_puzzle"
    stages = STAGES

    def __init__(
        self,
        horizon: int = 12,
        success_reward: float = 1.0,
        jam_reward: float = 0.0,
        step_reward: float = 0.0,
    ) -> None:
        super().__init__(horizon)
        self.success_reward = float(success_reward)
        self.jam_reward = float(jam_reward)
        self.step_reward = float(step_reward)
        self.dials: Dials = ()
        self.code: Dials = ()
        self.selected = 0
        # The state before the last action (None at the start), for reflectors.
        self.previous: tuple[Dials, int] | None = None
        self.last_action: int | None = None
        self.success = False
        self.jammed = False
        self._seed_rng = random.Random(0)  # seeds of reset() without seed or task

    # -- tasks -------------------------------------------------------------------------------------------
    def make_tasks(self, split: str, n: int, seed: int = 0, difficulty: str | None = None) -> list[Task]:
        """``n`` tasks of ``split`` with seeds ``split_seed(seed, split, i)``; difficulty None cycles the stages."""
        if split not in SPLITS:
            raise ValueError(f"lock_puzzle: unknown split {split!r}; expected one of {SPLITS}")
        if n < 0:
            raise ValueError(f"lock_puzzle: number of tasks must be >= 0, got {n}")
        if difficulty is not None:
            self.check_difficulty(difficulty)
        tasks = []
        for i in range(n):
            stage = difficulty or self.stages[i % len(self.stages)]
            tasks.append(self._task(split_seed(seed, split, i), stage, split, f"lock-{split}-{stage}-{i}"))
        return tasks

    def _task(self, task_seed: int, stage: str, split: str, task_id: str) -> Task:
        start, code = draw_puzzle(random.Random(task_seed), stage, split)
        data = {"start": list(start), "code": list(code), "shortest_steps": shortest_steps(start, code)}
        return Task(env=self.name, task_id=task_id, difficulty=stage, seed=task_seed, data=data)

    # -- episode -----------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, task: Task | None = None) -> Observation:
        """Start the episode of ``task``; without one, a ``three_dials`` train puzzle drawn from ``seed``.

        The puzzle has no episode-level randomness, so ``seed`` matters only when ``task`` is None."""
        if task is None:
            task_seed = self._seed_rng.randrange(2**31) if seed is None else int(seed)
            task = self._task(task_seed, self.stages[-1], "train", f"lock-seed{task_seed}")
        if task.env != self.name:
            raise ValueError(f"lock_puzzle: cannot run task {task.task_id!r} of environment {task.env!r}")
        self.check_difficulty(task.difficulty)
        self.task = task
        self.dials = tuple(int(d) for d in task.data["start"])
        self.code = tuple(int(c) for c in task.data["code"])
        if len(self.dials) != NUM_DIALS or len(self.code) != NUM_DIALS:
            raise ValueError(f"lock_puzzle: task {task.task_id!r} needs {NUM_DIALS} dials and code digits")
        self.selected, self.previous, self.last_action = 0, None, None
        self.success = self.jammed = False
        self.t, self.done = 0, False
        self.observation = Observation(render(self.dials, self.code, self.selected), ACTIONS)
        return self.observation

    def step(self, action_index: int) -> StepResult:
        action = self._check_action(action_index)
        self.t += 1
        self.previous, self.last_action = (self.dials, self.selected), action
        terminated, stuck, reward = False, False, self.step_reward
        if action == OPEN:
            terminated = True
            self.success = self.dials == self.code
            self.jammed = not self.success
            reward = self.success_reward if self.success else self.jam_reward
        elif action == NEXT:
            self.selected = (self.selected + 1) % NUM_DIALS
        else:
            value = self.dials[self.selected] + (1 if action == UP else -1)
            stuck = not LOWEST <= value <= HIGHEST
            if not stuck:
                self.dials = (*self.dials[: self.selected], value, *self.dials[self.selected + 1 :])
        truncated = not terminated and self.t >= self.horizon
        self.done = terminated or truncated
        move = describe_move(action, self.dials, self.selected, stuck)
        self.observation = Observation(render(self.dials, self.code, self.selected, move), ACTIONS)
        info: dict[str, Any] = {"success": self.success, "crash": self.jammed, "stuck": stuck}
        return self.observation, reward, terminated, truncated, info

    def instance_key(self, task: Task) -> str:
        """``<stage>:<start>/<code>``: the puzzle a task poses. A stage has a few hundred puzzles, so a hundred
        held-out tasks repeat some; evaluation resamples puzzles, not tasks, for its intervals."""
        return f"{task.difficulty}:{''.join(map(str, task.data['start']))}/{''.join(map(str, task.data['code']))}"

    # -- oracle and state --------------------------------------------------------------------------------
    def oracle_action(self) -> int:
        """Turn the selected dial toward its code digit; when it is right, open if all are right, else move on."""
        if not self.dials:
            raise RuntimeError("lock_puzzle: oracle_action() called before reset()")
        shown, wanted = self.dials[self.selected], self.code[self.selected]
        if shown != wanted:
            return UP if wanted > shown else DOWN
        return OPEN if self.dials == self.code else NEXT

    def state_key(self) -> tuple[str, Dials, Dials, int]:
        """``(env, dials, code, selected dial)``: everything that decides the future; no step count, no history."""
        if not self.dials:
            raise RuntimeError("lock_puzzle: state_key() called before reset()")
        return (self.name, self.dials, self.code, self.selected)


__all__ = [
    "ACTIONS",
    "DOWN",
    "NEXT",
    "OPEN",
    "STAGES",
    "UP",
    "LockPuzzleEnv",
    "distance",
    "render",
    "shortest_steps",
    "split_of",
]
