"""Offline reflections for LockPuzzle, written from the environment's state (no model, no API).

A reflection has at most two sentences: what the last action did and whether it was good or a mistake (a turn is
good when it brings the dial closer to its code digit, a selection when the dial it leaves was right), then the next
action -- the oracle's, quoted by its exact action text (e.g. ``turn the dial up``) -- with its reason: the selected
dial's digit and code digit first, the judgement after (so that a small model copies the digits before it decides). The wording
comes from a few templates drawn with the caller's seeded ``rng``, so the same seed writes the same data.
"""

from __future__ import annotations

import random

from reflect_trl.reflection import ReflectionContext

from reflect_lock_puzzle.env import ACTIONS, DOWN, NEXT, NUM_DIALS, OPEN, UP, LockPuzzleEnv, right_dials

_OPENED = (
    "Opening the lock worked: every dial showed the code.",
    "The lock opened, so the puzzle is solved.",
)
_JAMMED = (
    "Opening the lock was a mistake: only {right} of {n} dials were right, so the lock jammed.",
    "That was a mistake: I opened the lock with {right} of {n} dials right, and it jammed.",
)
_STUCK = (
    "Turning dial {dial} {way} did nothing because it is already at {shown}; that step was wasted.",
    "That was a mistake: dial {dial} cannot go {way} from {shown}, so the turn was wasted.",
)
_MATCHED = (
    "Turning dial {dial} {way} was right: it now matches the code.",
    "Good: dial {dial} now shows its code digit.",
)
_CLOSER = (
    "Turning dial {dial} {way} was right: it is one step closer to the code.",
    "Good: dial {dial} moved closer to its code digit.",
)
_WAS_RIGHT = (
    "Turning dial {dial} {way} was a mistake: it already matched the code.",
    "That was a mistake: dial {dial} was right, and turning it {way} moved it off the code.",
)
_AWAY = (
    "Turning dial {dial} {way} was a mistake: it moved away from the code.",
    "That was a mistake: dial {dial} went {way}, away from its code digit.",
)
_SELECTED = (
    "Selecting dial {dial} was right: dial {left} already matched the code.",
    "Good: dial {left} was done, so moving on to dial {dial} was right.",
)
_LEFT_WRONG = (
    "Selecting dial {dial} was a mistake: dial {left} did not match the code yet.",
    "That was a mistake: I left dial {left} before it matched the code.",
)
_PLAN = (
    "{Reason}, so I should {action}.",
    "{Reason}; my next action is to {action}.",
    "{Reason}, so next I {action}.",
)
# The plan reads the selected dial first and judges it after: the digits come before the decision.
_READING = (
    "dial {dial} shows {shown} and the code needs {wanted}",
    "dial {dial} is at {shown} and its code digit is {wanted}",
)
_VERDICT = {
    UP: ("too low", "below the code"),
    DOWN: ("too high", "above the code"),
    NEXT: (
        "it matches, but only {right} of {n} dials are right",
        "that is right, yet {right} of {n} dials are right",
    ),
    OPEN: ("it matches, and all {n} dials are right", "that is right, and every dial matches the code"),
}


class LockPuzzleOracleReflector:
    """Seeded, template-based reflections for :class:`~reflect_lock_puzzle.env.LockPuzzleEnv`."""

    def reflect(self, ctx: ReflectionContext, rng: random.Random) -> str:
        env = ctx.env
        if not isinstance(env, LockPuzzleEnv):
            raise TypeError(f"LockPuzzleOracleReflector needs a LockPuzzleEnv, got {type(env).__name__}")
        sentences = []
        if ctx.last_action is not None:
            if env.previous is None or env.last_action is None:
                raise ValueError(
                    f"reflection context names a last action {ctx.last_action!r} but the environment "
                    "has taken no step in this episode"
                )
            if ACTIONS[env.last_action] != ctx.last_action:
                raise ValueError(
                    f"reflection context names {ctx.last_action!r}, the environment's last action was "
                    f"{ACTIONS[env.last_action]!r}"
                )
            sentences.append(self.review(env, rng))
        if not env.done:
            sentences.append(self.plan(env, ctx.oracle_action, rng))
        return " ".join(sentences)

    @staticmethod
    def review(env: LockPuzzleEnv, rng: random.Random) -> str:
        """What the last action did, and whether it was good or a mistake."""
        assert env.previous is not None and env.last_action is not None
        (before, selected), after, code = env.previous, env.dials, env.code
        if env.last_action == OPEN:
            if env.success:
                return rng.choice(_OPENED)
            return rng.choice(_JAMMED).format(right=right_dials(before, code), n=NUM_DIALS)
        if env.last_action == NEXT:
            pool = _SELECTED if before[selected] == code[selected] else _LEFT_WRONG
            return rng.choice(pool).format(dial=env.selected + 1, left=selected + 1)
        way = "up" if env.last_action == UP else "down"
        if before == after:
            pool = _STUCK
        elif abs(after[selected] - code[selected]) < abs(before[selected] - code[selected]):
            pool = _MATCHED if after[selected] == code[selected] else _CLOSER
        else:
            pool = _WAS_RIGHT if before[selected] == code[selected] else _AWAY
        return rng.choice(pool).format(dial=selected + 1, way=way, shown=after[selected])

    @staticmethod
    def plan(env: LockPuzzleEnv, next_action: int, rng: random.Random) -> str:
        """The next action by its exact text, with its reason."""
        fields = {
            "dial": env.selected + 1,
            "shown": env.dials[env.selected],
            "wanted": env.code[env.selected],
            "right": right_dials(env.dials, env.code),
            "n": NUM_DIALS,
        }
        reason = f"{rng.choice(_READING)}: {rng.choice(_VERDICT[next_action])}".format(**fields)
        return rng.choice(_PLAN).format(
            reason=reason, Reason=reason[0].upper() + reason[1:], action=ACTIONS[next_action]
        )


__all__ = ["LockPuzzleOracleReflector"]
