"""The vocabulary of the environment contract checker: statuses, one check's line, the report, and the record of a
played task (shared by :mod:`reflect_trl.envs.check` and :mod:`reflect_trl.envs.check_semantics`)."""

from __future__ import annotations

import json
import traceback
from dataclasses import dataclass, field
from typing import Any

from reflect_trl.envs.base import Observation, Task

PASS, FAIL, WARN, SKIP = "PASS", "FAIL", "WARN", "SKIP"


#: Characters per token assumed without a tokenizer (a BPE tokenizer trained on the environment's text does better).
CHARS_PER_TOKEN = 3.0


class EnvContractError(AssertionError):
    """Raised by :meth:`ContractReport.raise_for_failures`: the failed checks, one per line."""


@dataclass(frozen=True)
class Check:
    """The outcome of one check."""

    name: str
    status: str
    detail: str

    def line(self) -> str:
        return f"{self.status}  {self.name:<16s} {self.detail}"


@dataclass
class ContractReport:
    """Every check of one environment, in order; ``facts`` holds measured numbers (steps, lengths)."""

    env_name: str
    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    def status(self, name: str) -> str:
        return next(c.status for c in self.checks if c.name == name)

    def lines(self) -> list[str]:
        return [c.line() for c in self.checks]

    def summary(self) -> str:
        counts = {s: sum(c.status == s for c in self.checks) for s in (FAIL, WARN, SKIP)}
        verdict = "the contract holds" if self.ok else "the contract is broken"
        return (
            f"{self.env_name}: {len(self.checks)} checks, {counts[FAIL]} failed, {counts[WARN]} warnings, "
            f"{counts[SKIP]} skipped: {verdict}"
        )

    def raise_for_failures(self, strict: bool = False) -> None:
        """Raise :class:`EnvContractError` naming the failed checks (``strict``: the warnings too)."""
        bad = [c for c in self.checks if c.status == FAIL or (strict and c.status == WARN)]
        if bad:
            raise EnvContractError("\n".join([self.summary(), *(c.line() for c in bad)]))


class _Failed(Exception):
    """A check failed (its message says what and where)."""


def _where(err: BaseException) -> str:
    frames = [
        f for f in traceback.extract_tb(err.__traceback__) if "/reflect_trl/envs/check.py" not in f.filename
    ]
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _raised(what: str, err: BaseException) -> str:
    return f"{what} raised {type(err).__name__}: {err}{_where(err)}"


@dataclass
class _Played:
    """The oracle's episode of one task: observations, actions and rewards."""

    split: str
    task: Task
    observations: list[Observation]
    actions: list[int]
    rewards: list[float]
    success: bool
    truncated: bool

    def fingerprint(self) -> str:
        """The problem as the oracle experiences it (equal for two tasks that pose the same problem)."""
        return json.dumps(
            [self.task.difficulty, [[o.text, list(o.actions)] for o in self.observations], self.rewards],
            sort_keys=True,
        )

    def where(self) -> str:
        return f"task {self.task.task_id!r} ({self.split}, {self.task.difficulty})"
