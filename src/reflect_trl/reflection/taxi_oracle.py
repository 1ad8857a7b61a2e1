"""Offline reflections for DangerousTaxi, written from the environment's shortest-path tables.

A reflection has at most three short sentences: what the last action did, whether it was good or a mistake
(judged by whether it shortened the shortest route to the mode's goal, so an equally short alternative to the
planned move is not called a mistake), and the next action with a reason. The wording is drawn from several
templates per situation with the caller's seeded ``rng``. The next action is always quoted by its exact action
text (e.g. ``move north``) so that data builders can check that a reflection names the recovery.
"""

from __future__ import annotations

import random

from reflect_trl.envs.taxi import (
    ACTIONS,
    DROPOFF,
    MOVE_DELTAS,
    PICKUP,
    DangerousTaxiEnv,
    TaxiState,
    decode_state,
    taxi_dynamics,
)
from reflect_trl.reflection.base import ReflectionContext

_DIRECTIONS = {0: "south", 1: "north", 2: "east", 3: "west"}
_NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four"}

_GOOD_MOVE = (
    "Moving {dir} brought me to row {row}, col {col}, closer to the {target}.",
    "I moved {dir} to row {row}, col {col}, a good step toward the {target}.",
    "Good: moving {dir} put me at row {row}, col {col}, one step nearer the {target}.",
    "The move {dir} worked and took me to row {row}, col {col}, nearer the {target}.",
)
_GOOD_DETOUR = (
    "Moving {dir} to row {row}, col {col} was right: it goes around a wall on the way to the {target}.",
    "I moved {dir} to row {row}, col {col}, a good detour around the walls toward the {target}.",
    "Good: moving {dir} to row {row}, col {col} steers around a wall toward the {target}.",
)
_MISTAKE_AWAY = (
    "Moving {dir} took me away from the {target}; that was a mistake.",
    "That was a mistake: moving {dir} to row {row}, col {col} took me away from the {target}.",
    "I moved {dir}, but it led away from the {target}, which was a mistake.",
    "Moving {dir} was the wrong choice: it took me farther from the {target}.",
)
_MISTAKE_WALLED = (
    "Moving {dir} was a mistake: a wall blocks that way to the {target}, so it only adds a detour.",
    "That was a mistake: moving {dir} looks closer to the {target}, but a wall makes it a detour.",
    "Moving {dir} to row {row}, col {col} was wrong, since a wall cuts that path to the {target}.",
)
_GOOD_PICKUP = (
    "I picked up the passenger, so that step was right.",
    "Picking up the passenger worked; they are now in the taxi.",
    "Good: the passenger is now aboard.",
)
_WRONG_DROPOFF = (
    "Dropping the passenger off at row {row}, col {col} was a mistake, since it is not the destination.",
    "That was a mistake: I dropped the passenger at row {row}, col {col}, which is not the destination.",
    "I dropped the passenger off at row {row}, col {col}, but that is not the destination: a mistake.",
)
_DELIVERED = (
    "I dropped the passenger off at the destination, so the trip is complete.",
    "The passenger is delivered at the destination; the job is done.",
)
_CRASHED = (
    "{action} had no effect because {why}, so the taxi crashed and the episode is over; that was a mistake.",
    "That was a mistake: {action} did nothing because {why}, which crashed the taxi.",
)
_PLAN = (
    "{Reason}, so I should {action}.",
    "Since {reason}, my next action is {action}.",
    "Next I will {action}, because {reason}.",
    "{Reason}; the right move now is {action}.",
    "Because {reason}, I {action} next.",
)
_ON_PASSENGER = (
    "I am on the passenger's cell",
    "the taxi stands where the passenger waits",
    "the passenger is right here at my cell",
)
_ON_DESTINATION = (
    "I am on the destination with the passenger aboard",
    "the taxi carries the passenger and stands on the destination",
    "the passenger is in the taxi and we have reached the destination",
)
_DETOUR = (
    "a wall blocks the direct way to the {target}",
    "the {target} lies behind a wall that I have to drive around",
    "the straight path to the {target} is walled off",
)


def _count(n: int, unit: str) -> str:
    return f"{_NUMBER_WORDS.get(n, str(n))} {unit}{'s' if n != 1 else ''}"


def _offset_phrase(here: tuple[int, int], there: tuple[int, int]) -> str:
    """E.g. ``two rows south and one column west`` (the non-zero parts only)."""
    dr, dc = there[0] - here[0], there[1] - here[1]
    parts = []
    if dr:
        parts.append(f"{_count(abs(dr), 'row')} {'south' if dr > 0 else 'north'}")
    if dc:
        parts.append(f"{_count(abs(dc), 'column')} {'east' if dc > 0 else 'west'}")
    return " and ".join(parts)


def _manhattan(a: tuple[int, int], b: tuple[int, int]) -> int:
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def _target(s: TaxiState) -> tuple[str, tuple[int, int]]:
    """What the taxi is heading for in state ``s``: the waiting passenger or, with the passenger aboard, the
    destination."""
    if s.in_taxi:
        return "destination", s.destination_cell
    return "passenger", s.passenger_cell  # type: ignore[return-value]


def _gerund(action: int) -> str:
    if action in _DIRECTIONS:
        return f"moving {_DIRECTIONS[action]}"
    return "picking up the passenger" if action == PICKUP else "dropping the passenger off"


def _crash_reason(action: int, s: TaxiState) -> str:
    if action in MOVE_DELTAS:
        dr, dc = MOVE_DELTAS[action]
        row, col = s.row + dr, s.col + dc
        if not (0 <= row < 5 and 0 <= col < 5):
            return "the grid ends there"
        return "a wall is in the way"
    if action == PICKUP:
        return "the passenger is already aboard" if s.in_taxi else "the passenger is not at this cell"
    if not s.in_taxi:
        return "there is no passenger in the taxi"
    return "this cell is not a place where passengers can get out"


class TaxiOracleReflector:
    """Seeded, template-based reflections for :class:`~reflect_trl.envs.taxi.DangerousTaxiEnv`."""

    def reflect(self, ctx: ReflectionContext, rng: random.Random) -> str:
        env = ctx.env
        if not isinstance(env, DangerousTaxiEnv):
            raise TypeError(f"TaxiOracleReflector needs a DangerousTaxiEnv, got {type(env).__name__}")
        sentences = []
        if ctx.last_action is not None:
            if env.previous_state is None:
                raise ValueError(
                    f"reflection context names a last action {ctx.last_action!r} but the environment "
                    "has taken no step in this episode"
                )
            sentences.append(self._review(env, ctx.last_action, rng))
        if not env.done:
            sentences.append(self._plan(env, ctx.oracle_action, rng))
        return " ".join(sentences)

    # -- what the last action did, and whether it was good ------------------------------------------------
    def _review(self, env: DangerousTaxiEnv, last_action: str, rng: random.Random) -> str:
        if last_action not in ACTIONS:
            raise ValueError(
                f"unknown taxi action {last_action!r} in the reflection context; known: {ACTIONS}"
            )
        action = ACTIONS.index(last_action)
        before_id, after_id = env.previous_state, env.state
        assert before_id is not None
        before, after = decode_state(before_id), decode_state(after_id)
        if before_id == after_id:
            text = rng.choice(_CRASHED).format(action=_gerund(action), why=_crash_reason(action, before))
            return text[0].upper() + text[1:]
        if action == PICKUP:
            return rng.choice(_GOOD_PICKUP)
        if action == DROPOFF:
            if after.delivered:
                return rng.choice(_DELIVERED)
            return rng.choice(_WRONG_DROPOFF).format(row=after.row, col=after.col)
        target_name, target_cell = _target(before)
        distance = taxi_dynamics().distance[env.goal]
        shortened = distance[after_id] == distance[before_id] - 1
        nearer = _manhattan(after.taxi, target_cell) < _manhattan(before.taxi, target_cell)
        if shortened:
            pool = _GOOD_MOVE if nearer else _GOOD_DETOUR
        else:
            pool = _MISTAKE_WALLED if nearer else _MISTAKE_AWAY
        return rng.choice(pool).format(
            dir=_DIRECTIONS[action], row=after.row, col=after.col, target=target_name
        )

    # -- what to do next, and why ------------------------------------------------------------------------
    def _plan(self, env: DangerousTaxiEnv, next_action: int, rng: random.Random) -> str:
        now = env.taxi_state
        if next_action == PICKUP:
            reason = rng.choice(_ON_PASSENGER)
        elif next_action == DROPOFF:
            reason = rng.choice(_ON_DESTINATION)
        else:
            target_name, target_cell = _target(now)
            dr, dc = MOVE_DELTAS[next_action]
            moved = (now.row + dr, now.col + dc)
            if _manhattan(moved, target_cell) < _manhattan(now.taxi, target_cell):
                verb = "waits" if target_name == "passenger" else "is"
                reason = f"the {target_name} {verb} {_offset_phrase(now.taxi, target_cell)}"
            else:
                reason = rng.choice(_DETOUR).format(target=target_name)
        return rng.choice(_PLAN).format(
            reason=reason, Reason=reason[0].upper() + reason[1:], action=ACTIONS[next_action]
        )


__all__ = ["TaxiOracleReflector"]
