"""DangerousTaxi: agreement with gymnasium's Taxi-v4, the crash rule, modes, oracle optimality, seeding, text."""

from __future__ import annotations

import dataclasses
import random
from collections import deque

import gymnasium as gym
import pytest

from reflect_trl.envs import make_env
from reflect_trl.envs.base import SPLITS, Task
from reflect_trl.envs.taxi import (
    ACTIONS,
    DROPOFF,
    EAST,
    NORTH,
    PICKUP,
    SOUTH,
    STATIONS,
    WEST,
    DangerousTaxiEnv,
    decode_state,
    encode_state,
    start_state_for_seed,
)

STEP, BONUS, DELIVERY, CRASH = -1 / 20, 20 / 20, 20 / 20, -10 / 20


@pytest.fixture(scope="module")
def gym_taxi():
    env = gym.make("Taxi-v4")
    yield env
    env.close()


def _boarded(before: int, after: int) -> bool:
    return not decode_state(before).in_taxi and decode_state(after).in_taxi


# -- agreement with gymnasium -------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", DangerousTaxiEnv.stages)
def test_transitions_match_gymnasium_taxi_v4(gym_taxi, mode):
    """Random action sequences, stepped in lockstep with gym.make("Taxi-v4") from the same state."""
    env = DangerousTaxiEnv(horizon=15, mode=mode)
    seen = {"crash": 0, "first_step_crash": 0, "bonus": 0, "delivered": 0, "wrong_dropoff": 0, "moves": 0}
    for seed in range(2000):
        rng = random.Random(seed)
        env.reset(seed=seed)
        gym_state, info = gym_taxi.reset(seed=seed)
        if mode != "dropoff":
            assert env.state == gym_state, "the start state must be gymnasium's start state for that seed"
        gym_taxi.unwrapped.s = env.state
        bonus_paid = mode == "dropoff"
        done = False
        while not done:
            # Uniform (many crashes), gym's state-changing actions, or the shortest route (deliveries).
            draw = rng.random()
            if draw < 0.4:
                action = rng.randrange(6)
            elif draw < 0.7:
                action = rng.choice([a for a in range(6) if info["action_mask"][a]])
            else:
                action = env.oracle_action()
            before = env.state
            gym_next, gym_reward, gym_terminated, _, info = gym_taxi.step(action)
            _, reward, terminated, truncated, step_info = env.step(action)
            done = terminated or truncated
            assert step_info["state"] == env.state
            if gym_next == before:  # no visible effect: must crash, first step included
                seen["crash"] += 1
                seen["first_step_crash"] += env.t == 1
                assert step_info["crash"] and terminated and not truncated
                assert reward == CRASH and not step_info["success"]
                assert env.state == before
                break
            assert not step_info["crash"]
            assert env.state == gym_next
            expected_raw = float(gym_reward)
            boarded = _boarded(before, gym_next)
            if boarded and not bonus_paid and mode in ("pickup", "full"):
                expected_raw, bonus_paid = 20.0, True
                seen["bonus"] += 1
            assert reward == expected_raw / 20
            ends = gym_terminated or (mode == "pickup" and boarded)
            assert terminated == ends
            assert step_info["success"] == ends
            seen["delivered"] += bool(gym_terminated)
            seen["wrong_dropoff"] += action == DROPOFF and not gym_terminated
            seen["moves"] += action < 4
            if not terminated:
                assert truncated == (env.t >= 15)
    assert seen["crash"] > 0 and seen["first_step_crash"] > 0 and seen["moves"] > 0, seen
    assert (seen["bonus"] > 0) == (mode != "dropoff"), seen
    assert (seen["delivered"] > 0 and seen["wrong_dropoff"] > 0) == (mode != "pickup"), seen


def test_step_and_crash_rewards_are_configurable():
    """step_reward / crash_reward replace the paper's -1 / -10 (raw); the pickup bonus and delivery are unchanged."""
    env = make_env("taxi", mode="full", step_reward=0.0, crash_reward=-20.0)
    state = encode_state(0, 1, 0, 1)  # passenger at R (0, 0), destination G
    env.reset_to_state(state)
    assert env.step(WEST)[1] == 0.0  # ordinary move: no step cost
    assert env.step(PICKUP)[1] == BONUS
    env.reset_to_state(state)
    _, reward, terminated, _, info = env.step(NORTH)  # into the edge
    assert (reward, terminated, info["crash"], info["raw_reward"]) == (-1.0, True, True, -20.0)
    route = DangerousTaxiEnv(mode="dropoff", step_reward=0.0)
    route.reset(seed=3)
    rewards = []
    while not route.done:
        rewards.append(route.step(route.oracle_action())[1])
    assert rewards[-1] == DELIVERY and set(rewards[:-1]) == {0.0} and route.success


def test_timeout_reward_is_added_when_the_horizon_cuts_the_episode():
    """timeout_reward (raw) lands on the step the horizon cuts, never on a crash or a success; 0 by default."""
    state = encode_state(0, 1, 0, 1)  # passenger at R (0, 0), destination G; west then east never crash here
    for timeout, last in ((0.0, 0.0), (-10.0, CRASH)):
        env = DangerousTaxiEnv(mode="full", horizon=4, step_reward=0.0, timeout_reward=timeout)
        env.reset_to_state(state)
        rewards = [env.step(a) for a in (WEST, EAST, WEST, EAST)]
        assert [r[1] for r in rewards] == [0.0, 0.0, 0.0, last]
        assert rewards[-1][3] and not rewards[-1][2] and not rewards[-1][4]["crash"]
        env.reset_to_state(state)
        assert env.step(NORTH)[1] == CRASH  # a crash before the horizon: no timeout reward
    route = DangerousTaxiEnv(mode="dropoff", step_reward=0.0, timeout_reward=-10.0)
    route.reset(seed=3)
    while not route.done:
        reward = route.step(route.oracle_action())[1]
    assert reward == DELIVERY and route.success


def test_crash_on_first_step_for_every_no_effect_action():
    env = DangerousTaxiEnv(mode="full")
    # Taxi at (0, 1): wall to the east, edge to the north; passenger waits at R (0, 0), destination G.
    state = encode_state(0, 1, 0, 1)
    for action in (NORTH, EAST, PICKUP, DROPOFF):
        env.reset_to_state(state)
        obs, reward, terminated, truncated, info = env.step(action)
        assert (reward, terminated, truncated) == (CRASH, True, False), ACTIONS[action]
        assert info["crash"] and not info["success"] and env.done and env.state == state
        assert obs.actions == ACTIONS
        with pytest.raises(RuntimeError, match="finished episode"):
            env.step(SOUTH)
    for action in (SOUTH, WEST):
        env.reset_to_state(state)
        _, reward, terminated, _, info = env.step(action)
        assert (reward, terminated, info["crash"]) == (STEP, False, False)


# -- modes ----------------------------------------------------------------------------------------------------
def _run_plan(env: DangerousTaxiEnv) -> list[tuple[float, bool, bool, dict]]:
    results = []
    for action in env.oracle_plan():
        _, reward, terminated, truncated, info = env.step(action)
        results.append((reward, terminated, truncated, info))
    return results


def test_pickup_mode_ends_at_pickup_with_bonus():
    env = DangerousTaxiEnv(horizon=50, mode="pickup")
    for seed in range(30):
        env.reset(seed=seed)
        assert not env.taxi_state.in_taxi and not env.taxi_state.delivered
        results = _run_plan(env)
        rewards = [r for r, *_ in results]
        assert rewards == [STEP] * (len(rewards) - 1) + [BONUS]
        assert [t for _, t, _, _ in results] == [False] * (len(results) - 1) + [True]
        info = results[-1][3]
        assert info["success"] and info["picked_up"] and info["passenger_in_taxi"] and not info["delivered"]
        assert env.done


def test_dropoff_mode_starts_with_passenger_aboard_at_pickup_cell():
    env = DangerousTaxiEnv(horizon=50, mode="dropoff")
    for seed in range(30):
        gym_start = decode_state(start_state_for_seed(seed))
        obs = env.reset(seed=seed)
        now = env.taxi_state
        assert now.in_taxi and now.taxi == STATIONS[gym_start.passenger]
        assert now.destination == gym_start.destination
        assert env.t == 0 and env.actions_taken == [] and "Actions so far: none." in obs.text
        results = _run_plan(env)
        assert [r for r, *_ in results] == [STEP] * (len(results) - 1) + [DELIVERY]  # no pickup bonus
        assert results[-1][3]["success"] and results[-1][3]["delivered"]


def test_full_mode_pays_pickup_bonus_then_delivery():
    env = DangerousTaxiEnv(horizon=50, mode="full")
    for seed in range(30):
        env.reset(seed=seed)
        results = _run_plan(env)
        rewards = [r for r, *_ in results]
        assert rewards.count(BONUS) == 2 and rewards[-1] == DELIVERY
        assert all(r == STEP for r in rewards if r != BONUS)
        assert results[-1][3]["success"] and results[-1][3]["delivered"]
        assert not any(info["success"] for *_, info in results[:-1])


def test_pickup_bonus_is_paid_only_once():
    env = DangerousTaxiEnv(mode="full")
    env.reset_to_state(encode_state(0, 0, 0, 1))  # taxi on R with the passenger, destination G
    assert env.step(PICKUP)[1] == BONUS
    _, reward, terminated, _, info = env.step(DROPOFF)  # legal drop at the wrong station
    assert (reward, terminated, info["success"]) == (STEP, False, False)
    assert env.taxi_state.passenger == 0
    _, reward, _, _, info = env.step(PICKUP)
    assert reward == STEP and info["picked_up"]


def test_horizon_truncates_without_success():
    env = DangerousTaxiEnv(horizon=3, mode="full")
    env.reset_to_state(encode_state(2, 2, 0, 1))  # open middle of the grid
    outcomes = [env.step(a)[1:4] for a in (SOUTH, NORTH, SOUTH)]
    assert outcomes == [(STEP, False, False), (STEP, False, False), (STEP, False, True)]
    assert env.done and env.t == 3
    env.reset_to_state(encode_state(2, 2, 0, 1))
    env.step(SOUTH)
    env.step(NORTH)
    info = env.step(SOUTH)[4]
    assert info["success"] is False and info["crash"] is False


def test_mode_comes_from_task_difficulty_unless_fixed():
    task = Task(env="taxi", task_id="t", difficulty="dropoff", seed=5)
    env = DangerousTaxiEnv()
    env.reset(task=task)
    assert env.mode == "dropoff" and env.taxi_state.in_taxi
    fixed = DangerousTaxiEnv(mode="pickup")
    fixed.reset(task=task)
    assert fixed.mode == "pickup" and not fixed.taxi_state.in_taxi
    with pytest.raises(ValueError, match="unknown difficulty"):
        DangerousTaxiEnv(mode="hard")
    with pytest.raises(ValueError, match="environment 'alfworld'"):
        env.reset(task=Task(env="alfworld", task_id="x", difficulty="full", seed=1))


# -- oracle -----------------------------------------------------------------------------------------------------
def _independent_distance(P, state: int, mode: str) -> int:
    """Forward BFS over gymnasium's own transition table, avoiding no-effect actions."""

    def success(s: int, a: int, n: int, terminated: bool) -> bool:
        if mode == "pickup":
            return _boarded(s, n)
        return terminated

    queue, depth = deque([state]), {state: 0}
    while queue:
        s = queue.popleft()
        for a in range(6):
            (_, n, _, terminated) = P[s][a][0]
            if n == s:
                continue
            if success(s, a, n, terminated):
                return depth[s] + 1
            if not terminated and n not in depth:
                depth[n] = depth[s] + 1
                queue.append(n)
    raise AssertionError(f"goal unreachable from {state} in mode {mode}")


def _reachable_states(mode: str) -> list[int]:
    states = []
    for s in range(500):
        d = decode_state(s)
        waiting = not d.in_taxi and not d.delivered
        if waiting or (mode != "pickup" and d.in_taxi):
            states.append(s)
    return states


@pytest.mark.parametrize("mode", DangerousTaxiEnv.stages)
def test_oracle_is_shortest_from_every_reachable_state(gym_taxi, mode):
    P = gym_taxi.unwrapped.P
    env = DangerousTaxiEnv(horizon=100, mode=mode)
    states = _reachable_states(mode)
    assert len(states) == (300 if mode == "pickup" else 400)
    for state in states:
        expected = _independent_distance(P, state, mode)
        env.reset_to_state(state)
        assert env.oracle_distance() == expected
        assert len(env.oracle_plan()) == expected
        steps = 0
        info: dict = {}
        while not env.done:
            _, _, _, _, info = env.step(env.oracle_action())
            steps += 1
            assert not info["crash"]
        assert info["success"] and steps == expected, (state, decode_state(state), steps, expected)


# -- seeding and tasks ---------------------------------------------------------------------------------------------
def _episode(seed: int, mode: str) -> list:
    env = DangerousTaxiEnv(mode=mode)
    rng = random.Random(1234)
    trace = [env.reset(seed=seed).text]
    done = False
    while not done:
        obs, reward, terminated, truncated, info = env.step(rng.randrange(4))
        trace.append((obs.text, reward, terminated, truncated, info["state"]))
        done = terminated or truncated
    return trace


def test_same_seed_same_episode_and_different_seeds_differ():
    for mode in DangerousTaxiEnv.stages:
        assert _episode(7, mode) == _episode(7, mode)
    starts = {DangerousTaxiEnv(mode="full").reset(seed=seed).text for seed in range(40)}
    assert len(starts) >= 30  # 300 possible start states: a few collisions are expected
    assert start_state_for_seed(0) != start_state_for_seed(1)


def test_make_tasks_deterministic_disjoint_and_cycling():
    env = DangerousTaxiEnv()
    tasks = {split: env.make_tasks(split, 30, seed=3) for split in SPLITS}
    assert tasks["train"] == env.make_tasks("train", 30, seed=3)
    seeds = [{t.seed for t in tasks[split]} for split in SPLITS]
    assert all(len(s) == 30 for s in seeds)
    assert not (seeds[0] & seeds[1] or seeds[0] & seeds[2] or seeds[1] & seeds[2])
    assert [t.difficulty for t in tasks["train"][:6]] == ["pickup", "dropoff", "full"] * 2
    assert tasks["validation"][4].task_id == "taxi-validation-dropoff-4"
    assert {t.difficulty for t in env.make_tasks("test", 5, difficulty="full")} == {"full"}
    assert {t.difficulty for t in DangerousTaxiEnv(mode="pickup").make_tasks("test", 5)} == {"pickup"}
    assert env.make_tasks("train", 30, seed=4) != tasks["train"]
    for task in tasks["train"][:9]:
        obs = env.reset(task=task)
        assert env.state == task.data["start_state"] and env.oracle_distance() == task.data["shortest_steps"]
        assert env.reset(task=task).text == obs.text
    with pytest.raises(ValueError, match="unknown split"):
        env.make_tasks("dev", 2)


def test_clone_is_independent_and_registry_builds_the_env():
    env = make_env("taxi", horizon=9)
    assert isinstance(env, DangerousTaxiEnv) and env.horizon == 9
    env.reset(seed=2)
    twin = env.clone()
    twin.step(twin.oracle_action())
    assert env.t == 0 and env.actions_taken == [] and twin.t == 1
    assert twin.observation.text != env.observation.text


# -- rendering ---------------------------------------------------------------------------------------------------
GOLDEN = """\
DangerousTaxi on a 5x5 grid (row 0 is north, col 0 is west). A move into a wall | or the edge, or a wrong \
pickup or drop-off, has no effect: it crashes the taxi and ends the episode.
Legend: T taxi, P passenger, O taxi at passenger, X taxi with passenger, D destination, # taxi on D, \
@ taxi with passenger on D.
Goal: pick up the passenger, then drop them off at the destination.
+---------+
| : | : : |
| : | : : |
| : : : : |
| | : | : |
|P| : |#: |
+---------+
Taxi at row 4, col 3. Passenger waiting at row 4, col 0. Destination at row 4, col 3.
Actions so far: move south."""


def test_golden_rendering():
    env = DangerousTaxiEnv(mode="full")
    env.reset_to_state(encode_state(3, 3, 2, 3))  # passenger at Y, destination B
    obs, *_ = env.step(SOUTH)
    assert obs.text == GOLDEN
    assert len(obs.text.split()) < 150
    assert "Options" not in obs.text and "A. " not in obs.text


def grid_of(text: str) -> str:
    """The seven grid lines of an observation."""
    return "\n".join(text.splitlines()[3:10])


def test_destination_stays_visible_under_the_taxi():
    env = DangerousTaxiEnv(mode="full")
    # Empty taxi on the destination (B) -> '#'; loaded taxi on it -> '@'; elsewhere D is drawn.
    empty_on_dest = grid_of(env.reset_to_state(encode_state(4, 3, 0, 3)).text)
    assert "#" in empty_on_dest and "T" not in empty_on_dest and "P" in empty_on_dest
    loaded_on_dest = grid_of(env.reset_to_state(encode_state(4, 3, 4, 3)).text)
    assert "@" in loaded_on_dest and "X" not in loaded_on_dest
    loaded_elsewhere = grid_of(env.reset_to_state(encode_state(2, 2, 4, 3)).text)
    assert "X" in loaded_elsewhere and "D" in loaded_elsewhere
    at_passenger = grid_of(env.reset_to_state(encode_state(0, 0, 0, 1)).text)
    assert "O" in at_passenger and "D" in at_passenger
    # After delivery the taxi (with the passenger out) still marks the destination.
    env.reset_to_state(encode_state(4, 3, 4, 3))
    obs, reward, terminated, _, info = env.step(DROPOFF)
    assert info["success"] and reward == DELIVERY and terminated
    assert "@" in grid_of(obs.text) and "Passenger delivered at row 4, col 3" in obs.text


def test_state_key_merges_routes_and_separates_future_rewards():
    """GiGPO groups turns by ``state_key``: the Markov state, not the observation (which lists the actions so far)."""
    env = DangerousTaxiEnv()
    start = encode_state(2, 2, 0, 1)  # taxi in the open middle row, passenger at R, destination G
    keys, texts = [], []
    for route in ([], [NORTH, SOUTH], [SOUTH, NORTH]):
        env.reset_to_state(start, "full")
        for action in route:
            env.step(action)
        assert not env.crashed
        keys.append(env.state_key())
        texts.append(env.render())
    assert keys[0] == keys[1] == keys[2]  # three routes to one state: one key
    assert len(set(texts)) == 3  # ... although the observations differ (the action history)

    # Same gym state, different future rewards: a passenger picked up (bonus paid) and dropped at a wrong station
    # earns no second bonus, so that state must not share a key with the untouched start.
    env.reset_to_state(encode_state(0, 0, 0, 1), "full")  # taxi on R with the passenger, destination G
    fresh = env.state_key()
    _, reward, *_ = env.step(PICKUP)
    assert reward == BONUS
    _, reward, terminated, *_ = env.step(DROPOFF)  # a legal drop-off at R, not the destination
    assert not terminated and env.state == encode_state(0, 0, 0, 1)
    assert env.state_key() != fresh
    _, reward, *_ = env.step(PICKUP)
    assert reward != BONUS  # the future reward really differs
    # and the mode (goal and reward rules) is part of the key
    env.reset_to_state(start, "pickup")
    assert env.state_key() != keys[0]


def test_instance_key_is_the_stage_and_start_state():
    env = make_env("taxi")
    tasks = env.make_tasks("test", 300, seed=1000, difficulty="dropoff")
    keys = [env.instance_key(t) for t in tasks]
    assert len(set(keys)) == 12, "dropoff starts at one of 12 (station, destination) pairs"
    for task, key in zip(tasks, keys, strict=True):
        assert key == f"dropoff:{task.data['start_state']}"
        assert env.reset(task=task) and env.start_state == task.data["start_state"]
    full = env.make_tasks("test", 300, seed=1000, difficulty="full")
    assert len({env.instance_key(t) for t in full}) == len({t.data["start_state"] for t in full}) > 150
    # the same start state in another stage is another instance
    assert env.instance_key(dataclasses.replace(full[0], difficulty="pickup")) != env.instance_key(full[0])


def test_optimal_actions_are_every_first_step_of_a_shortest_route():
    env = make_env("taxi")
    ties = 0
    for task in env.make_tasks("test", 40, seed=3, difficulty="full"):
        env.reset(task=task)
        best = env.optimal_actions()
        assert env.oracle_action() in best
        ties += len(best) > 1
        for action in best:  # each one keeps a shortest route: the distance drops by one (or it wins)
            probe = make_env("taxi")
            probe.reset(task=task)
            before = probe.oracle_distance()
            probe.step(action)
            assert probe.success or probe.oracle_distance() == before - 1
    assert ties > 0, "some start states have two shortest first moves"


def test_crashes_name_their_cause():
    from reflect_trl.envs.taxi import DROPOFF, NORTH, PICKUP, crash_cause, encode_state

    assert crash_cause(encode_state(0, 2, 0, 1), NORTH) == "off_grid"
    assert crash_cause(encode_state(0, 1, 0, 1), 2) == "wall"  # east of (0,1) is the wall "|"
    assert crash_cause(encode_state(2, 2, 0, 1), PICKUP) == "pickup_not_at_passenger"
    assert crash_cause(encode_state(2, 2, 4, 1), PICKUP) == "pickup_passenger_on_board"
    assert crash_cause(encode_state(2, 2, 0, 1), DROPOFF) == "dropoff_no_passenger"
    assert crash_cause(encode_state(2, 2, 4, 1), DROPOFF) == "dropoff_not_at_station"
    env = make_env("taxi")
    env.reset(task=env.make_tasks("test", 1, seed=0, difficulty="full")[0])
    _, _, _, _, info = env.step(PICKUP if not env.optimal_actions() & {PICKUP} else DROPOFF)
    assert info["crash"] and info["crash_cause"] in ("pickup_not_at_passenger", "dropoff_no_passenger")
