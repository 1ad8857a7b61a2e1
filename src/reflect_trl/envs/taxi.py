"""DangerousTaxi: gymnasium's Taxi-v4 as a text game in which an action with no effect ends the episode.

Dynamics come from the transition table of gymnasium's (deterministic) ``TaxiEnv``, built once per process.
On top of it (Reflect-RL, section 2.1 of the method notes, with the fixes of section 9):

* **Crash rule**: an action that leaves the state unchanged (driving into a wall or off the grid, an illegal
  pickup or drop-off) ends the episode (``terminated``) with raw reward -10 -- on the first step too.
* **Reward scale**: raw rewards are divided by 20 (step -0.05, delivery +1, crash -0.5, pickup bonus +1).
  The step and crash rewards are constructor arguments (``step_reward``, ``crash_reward``; paper values by default);
  ``timeout_reward`` (0 by default, as in the paper) is added to the last step of an episode cut at the horizon.
* **Modes** (a task's ``difficulty``): ``pickup`` (the first pickup earns +20 raw instead of the step cost and
  ends the episode with success), ``dropoff`` (the episode starts with the passenger aboard at the pickup
  cell, reached by the shortest path; success = delivered), ``full`` (pickup bonus once, success = delivered).
* **Success** is the explicit flag ``info["success"]`` (picked up in ``pickup`` mode, delivered otherwise),
  never a return threshold.

Start states are drawn exactly as ``gym.make("Taxi-v4").reset(seed=seed)`` draws them, so a task seed
reproduces gymnasium's own start state.
"""

from __future__ import annotations

import copy
import random
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

from reflect_trl.envs.base import SPLITS, Observation, StepResult, Task, TextEnv, split_seed

#: The six actions, in gymnasium's order (index = gym action id).
ACTIONS: tuple[str, ...] = (
    "move south",
    "move north",
    "move east",
    "move west",
    "pickup passenger",
    "drop off passenger",
)
SOUTH, NORTH, EAST, WEST, PICKUP, DROPOFF = range(6)
#: Row/column change of each move action.
MOVE_DELTAS: dict[int, tuple[int, int]] = {SOUTH: (1, 0), NORTH: (-1, 0), EAST: (0, 1), WEST: (0, -1)}

NUM_STATES = 500
IN_TAXI = 4  # passenger location index meaning "inside the taxi"
#: The four stations (R, G, Y, B) where the passenger waits and may be dropped off, as (row, col).
STATIONS: tuple[tuple[int, int], ...] = ((0, 0), (0, 4), (4, 0), (4, 3))
#: gymnasium's map of walls; cell (row, col) is character ``2 * col + 1`` of line ``row + 1``.
GRID_MAP: tuple[str, ...] = (
    "+---------+",
    "|R: | : :G|",
    "| : | : : |",
    "| : : : : |",
    "| | : | : |",
    "|Y| : |B: |",
    "+---------+",
)

# Raw (unscaled) rewards; the environment returns raw / REWARD_SCALE.
REWARD_SCALE = 20.0
STEP_REWARD = -1.0
CRASH_REWARD = -10.0
PICKUP_BONUS = 20.0

#: Which goal the shortest-path oracle aims at in each mode.
GOAL_PICKUP = "pickup"
GOAL_DELIVER = "deliver"
MODE_GOALS: dict[str, str] = {"pickup": GOAL_PICKUP, "dropoff": GOAL_DELIVER, "full": GOAL_DELIVER}

# Grid markers.
EMPTY_TAXI, LOADED_TAXI, WAITING, TAXI_AT_PASSENGER, DESTINATION = "T", "X", "P", "O", "D"
EMPTY_TAXI_ON_DEST, LOADED_TAXI_ON_DEST = "#", "@"

_RULES = (
    "DangerousTaxi on a 5x5 grid (row 0 is north, col 0 is west). A move into a wall | or the edge, "
    "or a wrong pickup or drop-off, has no effect: it crashes the taxi and ends the episode."
)
_LEGEND = (
    "Legend: T taxi, P passenger, O taxi at passenger, X taxi with passenger, D destination, "
    "# taxi on D, @ taxi with passenger on D."
)
_GOALS: dict[str, str] = {
    "pickup": "Goal: drive to the passenger and pick them up.",
    "dropoff": "Goal: the passenger is aboard; drive to the destination and drop them off.",
    "full": "Goal: pick up the passenger, then drop them off at the destination.",
}


class TaxiState(NamedTuple):
    """A decoded gym state: taxi position, passenger location (0-3 station, 4 in taxi), destination (0-3)."""

    row: int
    col: int
    passenger: int
    destination: int

    @property
    def taxi(self) -> tuple[int, int]:
        return (self.row, self.col)

    @property
    def in_taxi(self) -> bool:
        return self.passenger == IN_TAXI

    @property
    def delivered(self) -> bool:
        return self.passenger == self.destination

    @property
    def passenger_cell(self) -> tuple[int, int] | None:
        """Where the passenger waits (None when aboard)."""
        return None if self.in_taxi else STATIONS[self.passenger]

    @property
    def destination_cell(self) -> tuple[int, int]:
        return STATIONS[self.destination]


def encode_state(row: int, col: int, passenger: int, destination: int) -> int:
    """gymnasium's state encoding ``((row * 5 + col) * 5 + passenger) * 4 + destination``."""
    return ((row * 5 + col) * 5 + passenger) * 4 + destination


def decode_state(state: int) -> TaxiState:
    if not 0 <= state < NUM_STATES:
        raise ValueError(f"taxi state id {state} out of range 0..{NUM_STATES - 1}")
    destination = state % 4
    state //= 4
    passenger = state % 5
    state //= 5
    return TaxiState(state // 5, state % 5, passenger, destination)


def _reaches_goal(goal: str, state: int, after: int, gym_terminated: bool) -> bool:
    """Is the transition ``state -> after`` the one that achieves ``goal``?

    ``pickup``: the passenger gets into the taxi; ``deliver``: gymnasium's successful drop-off."""
    if after == state:
        return False
    if goal == GOAL_PICKUP:
        return not decode_state(state).in_taxi and decode_state(after).in_taxi
    return gym_terminated


@dataclass(frozen=True)
class TaxiDynamics:
    """gymnasium's deterministic Taxi transition table, flattened, plus shortest-path tables per goal.

    ``next_state[s][a]``, ``raw_reward[s][a]``, ``gym_terminated[s][a]`` copy gymnasium's ``P``;
    ``distance[goal][s]`` is the number of actions of a shortest crash-free route from ``s`` to the goal
    (-1 if none) and ``first_action[goal][s]`` the lowest-index action that starts one.
    """

    next_state: tuple[tuple[int, ...], ...]
    raw_reward: tuple[tuple[float, ...], ...]
    gym_terminated: tuple[tuple[bool, ...], ...]
    initial_distribution: Any  # numpy array, gymnasium's start-state distribution
    distance: dict[str, tuple[int, ...]]
    first_action: dict[str, tuple[int, ...]]

    def is_success_edge(self, goal: str, state: int, action: int) -> bool:
        """Does ``action`` in ``state`` reach ``goal`` (passenger boards / passenger delivered)?"""
        return _reaches_goal(goal, state, self.next_state[state][action], self.gym_terminated[state][action])


def _shortest_paths(
    next_state: tuple[tuple[int, ...], ...], gym_terminated: tuple[tuple[bool, ...], ...], goal: str
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Backward BFS over crash-free transitions: distance to ``goal`` and the first action of a shortest route."""

    def success(s: int, a: int) -> bool:
        return _reaches_goal(goal, s, next_state[s][a], gym_terminated[s][a])

    def ordinary(s: int, a: int) -> bool:  # a crash-free step that neither ends nor wins the episode
        return next_state[s][a] != s and not gym_terminated[s][a] and not success(s, a)

    distance = [-1] * NUM_STATES
    predecessors: list[list[int]] = [[] for _ in range(NUM_STATES)]
    queue: deque[int] = deque()
    for s in range(NUM_STATES):
        for a in range(len(ACTIONS)):
            if success(s, a):
                if distance[s] != 1:
                    distance[s] = 1
                    queue.append(s)
            elif ordinary(s, a):
                predecessors[next_state[s][a]].append(s)
    while queue:
        n = queue.popleft()
        for s in predecessors[n]:
            if distance[s] < 0:
                distance[s] = distance[n] + 1
                queue.append(s)
    first = [-1] * NUM_STATES
    for s in range(NUM_STATES):
        if distance[s] < 0:
            continue
        for a in range(len(ACTIONS)):
            if distance[s] == 1:
                starts_route = success(s, a)
            else:
                starts_route = ordinary(s, a) and distance[next_state[s][a]] == distance[s] - 1
            if starts_route:
                first[s] = a
                break
    return tuple(distance), tuple(first)


@lru_cache(maxsize=1)
def taxi_dynamics() -> TaxiDynamics:
    """The process-wide transition table (built once from ``gymnasium.envs.toy_text.taxi.TaxiEnv``)."""
    from gymnasium.envs.toy_text.taxi import TaxiEnv

    gym_env = TaxiEnv()
    next_state, raw_reward, terminated = [], [], []
    for s in range(NUM_STATES):
        row_next, row_reward, row_term = [], [], []
        for a in range(len(ACTIONS)):
            transitions = gym_env.P[s][a]
            if len(transitions) != 1:
                raise RuntimeError(
                    f"gymnasium Taxi transition ({s}, {a}) is not deterministic: {transitions}"
                )
            _, n, r, t = transitions[0]
            row_next.append(int(n))
            row_reward.append(float(r))
            row_term.append(bool(t))
        next_state.append(tuple(row_next))
        raw_reward.append(tuple(row_reward))
        terminated.append(tuple(row_term))
    next_t, term_t = tuple(next_state), tuple(terminated)
    distance, first = {}, {}
    for goal in (GOAL_PICKUP, GOAL_DELIVER):
        distance[goal], first[goal] = _shortest_paths(next_t, term_t, goal)
    return TaxiDynamics(
        next_state=next_t,
        raw_reward=tuple(raw_reward),
        gym_terminated=term_t,
        initial_distribution=gym_env.initial_state_distrib.copy(),
        distance=distance,
        first_action=first,
    )


def start_state_for_seed(seed: int) -> int:
    """The start state ``gym.make("Taxi-v4").reset(seed=seed)`` would draw."""
    from gymnasium.envs.toy_text.utils import categorical_sample
    from gymnasium.utils import seeding

    np_random, _ = seeding.np_random(int(seed))
    return int(categorical_sample(taxi_dynamics().initial_distribution, np_random))


def shortest_plan(state: int, goal: str) -> list[int]:
    """A shortest crash-free action sequence from ``state`` to ``goal`` (lowest action index on ties)."""
    dyn = taxi_dynamics()
    if dyn.distance[goal][state] < 0:
        raise RuntimeError(f"taxi: goal {goal!r} is unreachable from state {state} {decode_state(state)}")
    plan: list[int] = []
    while True:
        action = dyn.first_action[goal][state]
        plan.append(action)
        if dyn.is_success_edge(goal, state, action):
            return plan
        state = dyn.next_state[state][action]


def episode_start_state(seed: int, mode: str) -> int:
    """The state an episode of ``mode`` starts in for ``seed``: gymnasium's start state, or -- in ``dropoff``
    mode -- the state reached from it by a shortest route that picks the passenger up."""
    state = start_state_for_seed(seed)
    if mode == "dropoff":
        for action in shortest_plan(state, GOAL_PICKUP):
            state = taxi_dynamics().next_state[state][action]
    return state


#: Why a no-effect action crashed (``info["crash_cause"]``), by what in the observation could have shown it:
#: ``off_grid`` (the taxi's row / column and the move's direction), ``wall`` (a | of the grid), ``pickup_*`` /
#: ``dropoff_*`` (the passenger line and the grid markers: "Passenger in the taxi", O, X, @).
CRASH_CAUSES = (
    "off_grid",
    "wall",
    "pickup_not_at_passenger",
    "pickup_passenger_on_board",
    "dropoff_no_passenger",
    "dropoff_not_at_station",
)


def crash_cause(state: int, action: int) -> str:
    """The :data:`CRASH_CAUSES` entry of a no-effect ``action`` in ``state``."""
    s = decode_state(state)
    row, col = s.taxi
    if action in (SOUTH, NORTH, EAST, WEST):
        d_row, d_col = {SOUTH: (1, 0), NORTH: (-1, 0), EAST: (0, 1), WEST: (0, -1)}[action]
        return "off_grid" if not (0 <= row + d_row < 5 and 0 <= col + d_col < 5) else "wall"
    if action == PICKUP:
        return "pickup_passenger_on_board" if s.in_taxi else "pickup_not_at_passenger"
    return "dropoff_not_at_station" if s.in_taxi else "dropoff_no_passenger"


def _cell_marker(s: TaxiState, cell: tuple[int, int]) -> str:
    dest_here = cell == s.destination_cell
    if cell == s.taxi:
        if s.in_taxi or s.delivered:
            return LOADED_TAXI_ON_DEST if dest_here else LOADED_TAXI
        if cell == s.passenger_cell:
            return TAXI_AT_PASSENGER
        return EMPTY_TAXI_ON_DEST if dest_here else EMPTY_TAXI
    if cell == s.passenger_cell:
        return WAITING
    return DESTINATION if dest_here else " "


def render_grid(state: int) -> str:
    """The 5x5 grid with gymnasium's walls and this module's markers (station letters are not shown)."""
    s = decode_state(state)
    lines = [list(line) for line in GRID_MAP]
    for row in range(5):
        for col in range(5):
            lines[row + 1][2 * col + 1] = _cell_marker(s, (row, col))
    return "\n".join("".join(line) for line in lines)


def _where(cell: tuple[int, int]) -> str:
    return f"row {cell[0]}, col {cell[1]}"


def render_observation(state: int, mode: str, actions_taken: list[int] | tuple[int, ...]) -> str:
    """The observation text (no options list: the prompt builder adds it)."""
    s = decode_state(state)
    if s.in_taxi:
        passenger = "in the taxi"
    elif s.delivered:
        passenger = f"delivered at {_where(s.destination_cell)}"
    else:
        passenger = f"waiting at {_where(s.passenger_cell)}"
    history = ", ".join(ACTIONS[a] for a in actions_taken) if actions_taken else "none"
    return "\n".join(
        [
            _RULES,
            _LEGEND,
            _GOALS[mode],
            render_grid(state),
            f"Taxi at {_where(s.taxi)}. Passenger {passenger}. Destination at {_where(s.destination_cell)}.",
            f"Actions so far: {history}.",
        ]
    )


class DangerousTaxiEnv(TextEnv):
    """Taxi as a text game where a no-effect action crashes; see the module docstring for the rules.

    ``mode`` fixes the mode for every episode; None (default) takes it from each task's ``difficulty``
    (``full`` when reset without a task). The default horizon is 20 (as in the paper's data generation):
    the longest shortest ``full`` solution takes 18 steps, so with the paper's RL horizon of 15 about one
    ``full`` task in five could never succeed.
    """

    name = "taxi"
    stages = ("pickup", "dropoff", "full")

    def __init__(
        self,
        horizon: int = 20,
        mode: str | None = None,
        step_reward: float = STEP_REWARD,
        crash_reward: float = CRASH_REWARD,
        timeout_reward: float = 0.0,
    ) -> None:
        super().__init__(horizon)
        # Raw rewards (before the /20 scale). The paper's -1 per step makes an early crash *cheaper* than a late
        # one, so a policy that rarely succeeds learns to crash fast; step_reward=0 removes that incentive.
        self.step_reward = float(step_reward)
        self.crash_reward = float(crash_reward)
        # Raw reward added when the horizon cuts an episode: with step_reward=0 a timeout (0) pays more than a crash,
        # so a policy can learn to wander until the horizon; timeout_reward=crash_reward makes both failures equal.
        self.timeout_reward = float(timeout_reward)
        self.fixed_mode = None if mode is None else self.check_difficulty(mode)
        self.mode = self.fixed_mode or "full"
        self.state = -1  # gym state id
        self.start_state = -1
        self.actions_taken: list[int] = []
        self.state_history: list[int] = []  # state before each action, then the current one
        self.picked_up = False  # has the passenger been in the taxi during this episode
        self.bonus_given = False
        self.delivered = False
        self.crashed = False
        self.success = False
        self._seed_rng = random.Random(0)  # seeds for reset() without seed or task
        taxi_dynamics()  # build the shared table now, not inside the first step

    # -- tasks -------------------------------------------------------------------------------------------
    def make_tasks(self, split: str, n: int, seed: int = 0, difficulty: str | None = None) -> list[Task]:
        """``n`` tasks with seeds ``split_seed(seed, split, i)``; difficulty None cycles over the stages
        (or uses the environment's fixed mode). ``data`` records the start state and the length of its
        shortest solution (a task whose ``shortest_steps`` exceeds the horizon cannot succeed)."""
        if split not in SPLITS:
            raise ValueError(f"taxi: unknown split {split!r}; expected one of {SPLITS}")
        if n < 0:
            raise ValueError(f"taxi: number of tasks must be >= 0, got {n}")
        if difficulty is not None:
            self.check_difficulty(difficulty)
        tasks = []
        for i in range(n):
            level = difficulty or self.fixed_mode or self.stages[i % len(self.stages)]
            task_seed = split_seed(seed, split, i)
            start = episode_start_state(task_seed, level)
            steps = taxi_dynamics().distance[MODE_GOALS[level]][start]
            tasks.append(
                Task(
                    env=self.name,
                    task_id=f"taxi-{split}-{level}-{i}",
                    difficulty=level,
                    seed=task_seed,
                    data={"start_state": start, "shortest_steps": steps},
                )
            )
        return tasks

    # -- episode -----------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, task: Task | None = None) -> Observation:
        """Start the episode of ``task``: its start state comes from ``task.seed`` alone, so every episode of one task
        starts in the same state (DangerousTaxi has no other randomness, so ``seed`` is then unused). Without a task,
        the start state is drawn from ``seed`` exactly as ``gym.make("Taxi-v4").reset(seed=seed)`` draws it."""
        if task is not None and task.env != self.name:
            raise ValueError(f"taxi: cannot run task {task.task_id!r} of environment {task.env!r}")
        mode = self.fixed_mode or (task.difficulty if task is not None else "full")
        self.check_difficulty(mode)
        if task is None:
            if seed is None:
                seed = self._seed_rng.randrange(2**31)
            task = Task(env=self.name, task_id=f"taxi-seed{seed}-{mode}", difficulty=mode, seed=int(seed))
        return self._begin(episode_start_state(task.seed, mode), mode, task)

    def reset_to_state(self, state: int, mode: str | None = None) -> Observation:
        """Start an episode at an exact gym state id (tests, analysis). ``dropoff`` expects the passenger
        aboard; no pickup bonus is given for a state that already has the passenger in the taxi."""
        mode = self.check_difficulty(mode or self.fixed_mode or "full")
        task = Task(env=self.name, task_id=f"taxi-state{state}-{mode}", difficulty=mode, seed=-1)
        return self._begin(int(state), mode, task)

    def _begin(self, state: int, mode: str, task: Task) -> Observation:
        decode_state(state)  # validates the id
        self.task = task
        self.mode = mode
        self.state = self.start_state = state
        self.actions_taken = []
        self.state_history = [state]
        self.picked_up = decode_state(state).in_taxi
        self.bonus_given = self.picked_up or mode == "dropoff"
        self.delivered = self.crashed = self.success = False
        self.t = 0
        self.done = False
        self.observation = self._observe()
        return self.observation

    def _observe(self) -> Observation:
        return Observation(render_observation(self.state, self.mode, self.actions_taken), ACTIONS)

    def render(self) -> str:
        """The current observation text."""
        return render_observation(self.state, self.mode, self.actions_taken)

    def step(self, action_index: int) -> StepResult:
        action = self._check_action(action_index)
        dyn = taxi_dynamics()
        before = self.state
        after = dyn.next_state[before][action]
        self.t += 1
        self.actions_taken.append(action)
        terminated = False
        cause = None
        if after == before:  # no visible effect: the taxi crashes
            raw = self.crash_reward
            self.crashed = terminated = True
            cause = crash_cause(before, action)
        else:
            raw = dyn.raw_reward[before][action]
            if raw == STEP_REWARD:  # an ordinary move (or a legal drop-off away from the destination)
                raw = self.step_reward
            boarded = not decode_state(before).in_taxi and decode_state(after).in_taxi
            if boarded:
                self.picked_up = True
                if self.mode in ("pickup", "full") and not self.bonus_given:
                    raw = PICKUP_BONUS
                    self.bonus_given = True
                if self.mode == "pickup":
                    self.success = terminated = True
            if dyn.gym_terminated[before][action]:
                self.delivered = self.success = terminated = True
        self.state = after
        self.state_history.append(after)
        truncated = not terminated and self.t >= self.horizon
        if truncated:
            raw += self.timeout_reward
        self.done = terminated or truncated
        self.observation = self._observe()
        info = {
            "success": self.success,
            "crash": self.crashed,
            "delivered": self.delivered,
            "picked_up": self.picked_up,
            "passenger_in_taxi": decode_state(after).in_taxi,
            "state": after,
            "raw_reward": raw,
            "mode": self.mode,
        }
        if cause is not None:
            info["crash_cause"] = cause
        return self.observation, raw / REWARD_SCALE, terminated, truncated, info

    # -- oracle ------------------------------------------------------------------------------------------
    @property
    def goal(self) -> str:
        """What the shortest-path oracle aims at: ``pickup`` in pickup mode, ``deliver`` otherwise."""
        return MODE_GOALS[self.mode]

    def oracle_distance(self, state: int | None = None) -> int:
        """Actions on a shortest crash-free route from ``state`` (default: current) to this mode's success."""
        distance = taxi_dynamics().distance[self.goal][self.state if state is None else state]
        if distance < 0:
            raise RuntimeError(f"taxi: goal {self.goal!r} unreachable from state {self.state}")
        return distance

    def oracle_action(self) -> int:
        """First action of a shortest crash-free route to this mode's success (lowest index on ties)."""
        if self.state < 0:
            raise RuntimeError("taxi: oracle_action() called before reset()")
        action = taxi_dynamics().first_action[self.goal][self.state]
        if action < 0:
            raise RuntimeError(f"taxi: goal {self.goal!r} unreachable from state {decode_state(self.state)}")
        return action

    def optimal_actions(self) -> frozenset[int]:
        """Every action that starts a shortest crash-free route to this mode's success (all ties)."""
        dyn, distance = taxi_dynamics(), self.oracle_distance()
        best = set()
        for action in range(len(ACTIONS)):
            after = dyn.next_state[self.state][action]
            if dyn.is_success_edge(self.goal, self.state, action):
                if distance == 1:
                    best.add(action)
            elif after != self.state and dyn.distance[self.goal][after] == distance - 1:
                best.add(action)
        return frozenset(best)

    def oracle_plan(self) -> list[int]:
        """The whole shortest action sequence from the current state to this mode's success."""
        if self.state < 0:
            raise RuntimeError("taxi: oracle_plan() called before reset()")
        return shortest_plan(self.state, self.goal)

    # -- state access ------------------------------------------------------------------------------------
    def instance_key(self, task: Task) -> str:
        """``<stage>:<start state>``: a DangerousTaxi episode is fixed by its mode and start state (the ``dropoff``
        stage has only 12 start states, so a few hundred held-out tasks repeat them many times)."""
        mode = self.fixed_mode or self.check_difficulty(task.difficulty)
        return f"{mode}:{episode_start_state(task.seed, mode)}"

    def state_key(self) -> tuple[str, str, int, bool]:
        """``(env, mode, gym state id, pickup bonus already given)``.

        The gym state id fixes the taxi cell, the passenger location and the destination; the mode fixes the goal
        and the reward rules; ``bonus_given`` decides whether a future pickup still earns the bonus (``full``
        mode: a passenger dropped at a wrong station and picked up again earns nothing). The action history, shown
        in the observation text, is not part of it."""
        if self.state < 0:
            raise RuntimeError("taxi: state_key() called before reset()")
        return (self.name, self.mode, self.state, self.bonus_given)

    @property
    def taxi_state(self) -> TaxiState:
        return decode_state(self.state)

    @property
    def previous_state(self) -> int | None:
        """The state before the last action (None at the start of an episode)."""
        return self.state_history[-2] if len(self.state_history) >= 2 else None

    def clone(self) -> DangerousTaxiEnv:
        """A cheap independent copy (the transition table is shared at module level, never copied)."""
        twin = copy.copy(self)
        twin.actions_taken = list(self.actions_taken)
        twin.state_history = list(self.state_history)
        twin._seed_rng = random.Random()
        twin._seed_rng.setstate(self._seed_rng.getstate())
        return twin
