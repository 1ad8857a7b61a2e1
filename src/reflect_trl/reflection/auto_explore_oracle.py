"""Offline reflections for AutoExplore, written from the environment's shortest path to the answer.

A reflection has two parts, each drawn from seeded template variants:

1. what the last command did and whether it helped (it did iff it shortened the way to the answer file):
   "Descending into docs/ led away from the target: nothing there concerns the class `Foo`.";
2. the next command, quoted exactly, and why: "Next, `cd ..` to get back on track."

Negative examples (an injected wrong ``cd``/``cat``) therefore name the mistake and the way back. The text
stays under about 60 words and never mentions how it was produced.
"""

from __future__ import annotations

import random

from reflect_trl.reflection.base import ReflectionContext

_START = (
    "I am at {cwd} and need to find {topic}.",
    "Nothing explored yet; the goal is the file with {topic}.",
    "Starting the search for {topic} at {cwd}.",
)
_CD_DOWN_GOOD = (
    "Entering {name}/ was right: it is on the way to {topic}.",
    "Moving into {name}/ helped; {topic} lives further down this folder.",
)
_CD_DOWN_BAD = (
    "Descending into {name}/ led away from the target: nothing in it concerns {topic}.",
    "Going into {name}/ was a mistake; {topic} is not under this folder.",
)
_CD_UP_GOOD = (
    "Going back up to {cwd} was right: {before} does not hold {topic}.",
    "Backing out of {before} helped, since {topic} is elsewhere.",
)
_CD_UP_BAD = (
    "Going up to {cwd} was a mistake: {topic} was below {before}.",
    "Leaving {before} moved away from the target; {topic} is inside it.",
)
_CAT_GOOD = (
    "Reading {name} confirms it: this file has {topic}.",
    "Opening {name} paid off; it contains {topic}.",
)
_CAT_BAD = (
    "Opening {name} was a mistake: it has nothing about {topic}.",
    "{name} is not the file I need; it does not contain {topic}.",
)
_REFUSED = ("The last command was refused, so nothing changed.",)

_NEXT_UP = (
    "Next, `{cmd}` to get back on track.",
    "The way back is `{cmd}`: the answer is not below {cwd}.",
    "I should go up with `{cmd}` and look elsewhere.",
)
_NEXT_DOWN = (
    "Next, `{cmd}`: {topic} should be inside {name}/.",
    "The most promising folder is {name}/, so `{cmd}`.",
    "I will continue with `{cmd}`, where {topic} most likely lives.",
)
_NEXT_CAT = (
    "Next, `{cmd}` to check that it has {topic}.",
    "{name} looks like the right file; open it with `{cmd}`.",
)
_NEXT_ID = (
    "It matches, so `{cmd}` to report it.",
    "Next, `{cmd}`: this file is the answer.",
)


def _argument(command: str) -> str:
    return command.split(" ", 1)[1].strip('"').strip("'") if " " in command else command


def _where(rel: str) -> str:
    return f"{rel}/" if rel else "the repository root"


class AutoExploreOracleReflector:
    """Writes "what my last command did, and what to do next" reflections for :class:`AutoExploreEnv`."""

    def __init__(self, max_words: int = 60) -> None:
        self.max_words = max_words

    def reflect(self, ctx: ReflectionContext, rng: random.Random) -> str:
        env = ctx.env
        for attr in ("trace", "topic", "cwd"):
            if not hasattr(env, attr):
                raise TypeError(
                    f"AutoExploreOracleReflector needs an AutoExploreEnv, got {type(env).__name__}"
                )
        topic = env.topic
        cwd = _where(env.cwd)
        parts = [self._assess(ctx, rng, topic, cwd)]
        if topic in parts[0]:  # name the topic once; the plan then refers to it briefly
            topic = "the answer"
        nxt = ctx.oracle_action_text
        name = _argument(nxt)
        if nxt == "cd ..":
            templates = _NEXT_UP
        elif nxt.startswith("cd "):
            templates = _NEXT_DOWN
        elif nxt.startswith("cat "):
            templates = _NEXT_CAT
        else:
            templates = _NEXT_ID
        parts.append(rng.choice(templates).format(cmd=nxt, name=name, topic=topic, cwd=cwd))
        text = " ".join(parts)
        words = text.split()
        if len(words) > self.max_words:  # very long topics: drop the assessment, keep the plan
            text = parts[-1]
        return text

    def _assess(self, ctx: ReflectionContext, rng: random.Random, topic: str, cwd: str) -> str:
        env = ctx.env
        record = env.trace[-1] if env.trace else None
        if ctx.last_action is None or record is None or record.command != ctx.last_action:
            return rng.choice(_START).format(cwd=cwd, topic=topic)
        if not record.ok:
            return rng.choice(_REFUSED)
        helped = record.helped  # judged by the effect (shorter way to the answer), not by who chose it
        name = _argument(record.command)
        before = _where(record.cwd_before)
        if record.verb == "cd" and name == "..":
            templates = _CD_UP_GOOD if helped else _CD_UP_BAD
        elif record.verb == "cd":
            templates = _CD_DOWN_GOOD if helped else _CD_DOWN_BAD
        elif record.verb == "cat":
            templates = _CAT_GOOD if helped else _CAT_BAD
        else:
            return f"I identified {name}."
        return rng.choice(templates).format(name=name, topic=topic, cwd=cwd, before=before)
