"""Offline reflections for text games (TextWorld and ALFWorld), written from the game's own plan.

A reflection has up to three short sentences: what the last command did (quoting the game's response), whether
it followed the plan (``ctx.last_action_was_oracle``; a mistake is named as such, with the recovery), and the
next command -- its exact text, so data builders can check it -- with a reason read from its verb. The wording
is drawn from several templates with the caller's seeded ``rng``; a reflection stays under about 60 words.
"""

from __future__ import annotations

import random
import re

from reflect_trl.reflection.base import ReflectionContext

MAX_WORDS = 60
_FEEDBACK_WORDS = (22, 14, 8)  # quote lengths tried until the reflection fits MAX_WORDS

_DID = (
    '"{cmd}": {feedback}',
    'I tried "{cmd}" and the game said: {feedback}',
    'After "{cmd}", the game answered: {feedback}',
    'The command "{cmd}" gave: {feedback}',
)
_ON_PLAN = (
    "That was the right move.",
    "Good, that follows my plan.",
    "That step moved the task forward.",
    "That was a useful step.",
)
_MISTAKE = (
    "That was a mistake: it does not help with the task.",
    "That was a mistake, a detour from the task.",
    "That was the wrong choice; it wastes a step.",
    "That was a mistake and did not bring me closer to the goal.",
)
_SCORED = ("It earned points.", "The score went up.", "That scored.")
_PLAN = (
    'Next I will "{cmd}", because {why}.',
    'Now "{cmd}", since {why}.',
    'The next command is "{cmd}": {why}.',
    'I should "{cmd}" next, because {why}.',
)
_RECOVER = (
    'To recover, I should "{cmd}", because {why}.',
    'To get back on track: "{cmd}", since {why}.',
    'Recovery: "{cmd}" next, because {why}.',
)
_START = (
    'My task: {goal}. First, "{cmd}", because {why}.',
    'The goal is to {goal_verb}. I start with "{cmd}", since {why}.',
    'To {goal_verb}, my first command is "{cmd}": {why}.',
)
_START_NO_GOAL = (
    'First, "{cmd}", because {why}.',
    'I start with "{cmd}", since {why}.',
    'My first command is "{cmd}": {why}.',
)
_WON = ("The task is complete.", "That finished the game: it is won.", "Done: the goal is reached.")
_LOST = ("The game is lost.", "That ended the game in a loss.")
_OUT_OF_STEPS = ("I am out of steps.", "No steps are left.")
_LAST_STEP = ("it should complete the task", "it finishes the goal", "it is the last step of the task")

_DIRECTIONS = ("north", "south", "east", "west", "up", "down")


def _why(command: str, goal: str, rng: random.Random) -> str:
    """A short reason for a command, read from its verb (and whether it names what the goal names)."""
    cmd = command.strip()
    verb, _, rest = cmd.partition(" ")
    obj = re.split(r" (?:from|with|on|into|in|to) ", rest, maxsplit=1)[0]
    in_goal = bool(obj) and obj.rstrip(" 0123456789") in goal.lower()
    if verb == "go":
        if rest in _DIRECTIONS:
            return rng.choice(
                (f"what I need lies {rest}", f"the way forward is {rest}", f"the next room is to the {rest}")
            )
        target = rest.removeprefix("to ")
        return rng.choice((f"I need to check the {target}", f"the {target} is where the plan goes next"))
    if verb == "take":
        return rng.choice((f"the task needs the {obj}", f"I must hold the {obj} first"))
    if verb == "open":
        return rng.choice((f"the {obj} must be open to get inside", f"I need to see inside the {obj}"))
    if verb == "close":
        return rng.choice(
            (f"the {obj} should be closed before I move on", f"closing the {obj} is part of the plan")
        )
    if verb == "unlock":
        return rng.choice((f"the {obj} is locked", f"I cannot open the {obj} while it is locked"))
    if verb == "lock":
        return rng.choice((f"the goal wants the {obj} locked", f"the {obj} has to end up locked"))
    if verb in ("put", "insert", "move"):
        return rng.choice(("that places it where the task wants it", f"the {obj} belongs there for the goal"))
    if verb == "drop":
        return rng.choice((f"I do not need the {obj} any more", f"my hands must be free of the {obj}"))
    if verb in ("eat", "drink"):
        return rng.choice(("the goal asks me to eat it", f"eating the {obj} is part of the goal"))
    if verb in ("cook", "heat"):
        return rng.choice((f"the {obj} has to be cooked", f"the {obj} must be heated for the task"))
    if verb == "cool":
        return f"the {obj} has to be cooled for the task"
    if verb == "clean":
        return f"the {obj} has to be cleaned for the task"
    if verb in ("slice", "chop", "dice"):
        return rng.choice((f"the recipe wants the {obj} cut", f"the {obj} has to be {verb}d"))
    if verb == "prepare":
        return "all the ingredients are ready"
    if verb == "use":
        return rng.choice((f"turning on the {obj} lets me look in its light", f"the task needs the {obj} on"))
    if verb == "examine":
        if in_goal or "cookbook" in obj:
            return rng.choice((f"the {obj} holds what I need to know", f"I need to read the {obj}"))
        return rng.choice(("I need to see what is there", f"looking at the {obj} may show what I need"))
    if verb == "look":
        return rng.choice(("I need my bearings", "I should see what is around me"))
    if verb == "inventory":
        return rng.choice(("I should check what I carry", "I need to know what I hold"))
    return rng.choice(("it is the next step toward the goal", "it brings me closer to the goal"))


_GOAL_PREFIX = re.compile(r"^(?:your (?:objective|task|goal) is to|you (?:need|have) to)\s+", re.IGNORECASE)


def _goal_phrase(goal: str) -> str:
    """The goal as a short imperative phrase ('put some tomato on microwave'), '' when it is not one."""
    goal = _GOAL_PREFIX.sub("", " ".join(goal.split()).rstrip(".!"))
    if not goal or len(goal.split()) > 12 or re.search(r"[.!?]", goal):
        return ""
    return goal[0].lower() + goal[1:]


def _clip(text: str, limit: int) -> str:
    parts = text.split()
    if len(parts) <= limit:
        return " ".join(parts)
    return " ".join(parts[:limit]).rstrip(",;:") + " ..."


class TextGameOracleReflector:
    """Seeded, template-based reflections for :class:`~reflect_trl.envs.textworld_env.TextWorldEnv` and
    :class:`~reflect_trl.envs.alfworld_env.ALFWorldEnv` (any environment with ``last_feedback``, ``goal``,
    ``won``, ``lost`` and ``remaining_plan_length()``)."""

    def reflect(self, ctx: ReflectionContext, rng: random.Random) -> str:
        env = ctx.env
        for attribute in ("last_feedback", "goal", "won", "lost", "remaining_plan_length"):
            if not hasattr(env, attribute):
                raise TypeError(
                    f"TextGameOracleReflector needs a text-game environment (TextWorldEnv/ALFWorldEnv); "
                    f"{type(env).__name__} has no {attribute!r}"
                )
        goal = str(env.goal or "")
        # Draw every choice up front, in a fixed order, so the text depends only on (context, rng state).
        review = self._review(ctx, rng)
        verdict = self._verdict(ctx, rng)
        plan = self._plan(ctx, goal, rng)
        for limit in _FEEDBACK_WORDS:
            did = review.replace("{feedback}", self._feedback(env, limit))
            text = " ".join(s for s in (did, verdict, plan) if s)
            if len(text.split()) <= MAX_WORDS:
                return text
        return " ".join(s for s in (verdict, plan) if s) or text

    @staticmethod
    def _feedback(env, limit: int) -> str:
        feedback = str(env.last_feedback or "nothing happened.")
        feedback = re.sub(r"\s*Your score has just gone up by \w+ points?\.", "", feedback).strip()
        return _clip(feedback or "nothing happened.", limit)

    def _review(self, ctx: ReflectionContext, rng: random.Random) -> str:
        if ctx.last_action is None:
            return ""
        template = rng.choice(_DID)
        return template.replace("{cmd}", ctx.last_action)

    def _verdict(self, ctx: ReflectionContext, rng: random.Random) -> str:
        env = ctx.env
        parts = []
        if ctx.last_action is not None:
            if ctx.last_action_was_oracle is True:
                parts.append(rng.choice(_ON_PLAN))
            elif ctx.last_action_was_oracle is False:
                parts.append(rng.choice(_MISTAKE))
            if (ctx.last_reward or 0) > 0 and not env.won:
                parts.append(rng.choice(_SCORED))
        if env.won:
            parts.append(rng.choice(_WON))
        elif env.lost:
            parts.append(rng.choice(_LOST))
        elif env.done:
            parts.append(rng.choice(_OUT_OF_STEPS))
        return " ".join(parts)

    def _plan(self, ctx: ReflectionContext, goal: str, rng: random.Random) -> str:
        env = ctx.env
        if env.done:
            return ""
        command = ctx.oracle_action_text
        remaining = env.remaining_plan_length()
        why = rng.choice(_LAST_STEP) if remaining == 1 else _why(command, goal, rng)
        if ctx.last_action is None:
            goal_text = _goal_phrase(goal)
            if goal_text:
                template = rng.choice(_START)
                return template.format(cmd=command, why=why, goal=goal_text, goal_verb=goal_text)
            return rng.choice(_START_NO_GOAL).format(cmd=command, why=why)
        pool = _RECOVER if ctx.last_action_was_oracle is False else _PLAN
        return rng.choice(pool).format(cmd=command, why=why)


__all__ = ["MAX_WORDS", "TextGameOracleReflector"]
