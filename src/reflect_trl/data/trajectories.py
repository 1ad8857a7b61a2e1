"""The trajectories the SFT data is made of: the oracle's, with injected mistakes (negative examples), or the reference
code's "oracle + random p" behaviour; one :class:`StepRecord` per decision point with the oracle reflector's reflection."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reflect_trl.envs import Observation, OracleUnavailableError, Task, TextEnv
from reflect_trl.reflection import ReflectionContext, Reflector


@dataclass(frozen=True)
class StepRecord:
    """One decision point of a played trajectory."""

    task: Task
    step: int
    observation: Observation
    oracle_action: int
    reflection: str
    is_negative: bool
    last_action_index: int
    action: int = (
        -1
    )  # the action executed at this step (the oracle's, a mistake, or a behaviour policy's draw)


# -- trajectories --------------------------------------------------------------------------------------------
def oracle_outcome(env: TextEnv) -> tuple[bool, int]:
    """(success, steps) of following the oracle from ``env``'s current state (plays on ``env``: pass a clone)."""
    steps = 0
    while not env.done:
        try:
            action = env.oracle_action()
        except OracleUnavailableError:  # the oracle cannot continue from here under the option settings
            return False, steps
        _, _, terminated, truncated, info = env.step(action)
        steps += 1
        if terminated or truncated:
            return bool(info.get("success", False)), steps
    return False, steps


def candidate_mistakes(env: TextEnv, oracle: int, verify: bool) -> list[int]:
    """Legal non-oracle actions that do not end the episode (and, with ``verify``, are strictly worse)."""
    assert env.observation is not None
    baseline: tuple[bool, int] | None = None
    if verify:
        probe = env.clone()
        _, _, terminated, truncated, info = probe.step(oracle)
        baseline = (bool(info.get("success", False)), 1) if terminated or truncated else None
        if baseline is None:
            success, steps = oracle_outcome(probe)
            baseline = (success, steps + 1)
    candidates = []
    for action in range(len(env.observation.actions)):
        if action == oracle:
            continue
        probe = env.clone()
        _, _, terminated, truncated, _ = probe.step(action)
        if terminated or truncated:
            continue
        if verify and baseline is not None and baseline[0]:
            # Strictly worse than the oracle's action: after it the oracle fails, or needs more steps in total.
            # (When the oracle itself does not succeed from here there is nothing to compare with.)
            success, steps = oracle_outcome(probe)
            if success and steps + 1 <= baseline[1]:
                continue
        candidates.append(action)
    return candidates


def play_trajectory(
    env: TextEnv,
    task: Task,
    reflector: Reflector,
    reflection_seed: int,
    inject_at: Sequence[int] = (),
    inject_rng: random.Random | None = None,
    verify_mistakes: bool = True,
    random_action_prob: float = 0.0,
    behaviour_rng: random.Random | None = None,
) -> tuple[list[StepRecord], int, bool]:
    """Play ``task`` with the oracle, taking a wrong action at the decision points ``inject_at`` (postponed to
    the next point when none qualifies). With ``random_action_prob`` p > 0 the behaviour is the reference code's
    "oracle + random p" instead: at every step, with probability p a uniformly drawn action (a crash included),
    else the oracle's. Return the step records, the number of non-oracle actions taken and whether the episode ended
    in success."""
    rng = random.Random(reflection_seed)
    pending = sorted(set(inject_at))
    obs = env.reset(task=task)
    records: list[StepRecord] = []
    previous_obs: Observation | None = None
    last_action: int | None = None
    last_was_oracle: bool | None = None
    last_reward: float | None = None
    last_info: dict[str, Any] = {}
    mistakes = 0
    step = 0
    while True:
        oracle = env.oracle_action()
        ctx = ReflectionContext(
            env=env,
            observation=obs,
            step=step,
            oracle_action=oracle,
            previous_observation=previous_obs,
            last_action=None
            if last_action is None or previous_obs is None
            else previous_obs.actions[last_action],
            last_action_was_oracle=last_was_oracle,
            last_reward=last_reward,
            info=dict(last_info),
        )
        reflection = reflector.reflect(ctx, rng)
        action, was_oracle = oracle, True
        if random_action_prob > 0:
            assert behaviour_rng is not None
            if behaviour_rng.random() < random_action_prob:
                action = behaviour_rng.randrange(len(obs.actions))
                was_oracle = action == oracle
                mistakes += not was_oracle
        # Inject at a scheduled point, never right after a mistake (the recovery step takes the oracle's action).
        if pending and step >= pending[0] and last_was_oracle is not False:
            choices = candidate_mistakes(env, oracle, verify_mistakes)
            if choices:
                assert inject_rng is not None
                action, was_oracle = inject_rng.choice(choices), False
                pending.pop(0)
                mistakes += 1
        records.append(
            StepRecord(
                task=task,
                step=step,
                observation=obs,
                oracle_action=oracle,
                reflection=reflection,
                is_negative=last_was_oracle is False,
                last_action_index=-1 if last_action is None else last_action,
                action=action,
            )
        )
        previous_obs = obs
        obs, last_reward, terminated, truncated, last_info = env.step(action)
        last_action, last_was_oracle = action, was_oracle
        step += 1
        if terminated or truncated:
            return records, mistakes, bool(last_info.get("success", False))
