"""The contract of a :class:`~reflect_trl.envs.TextEnv`, checked: ``reflect-trl check-env NAME`` and
:func:`check_env_contract` (for a test of your own environment).

Each check plays the environment the way reflect-trl will (data generation, RL rollouts, evaluation) and reports
one line: ``PASS``, ``FAIL`` (what failed, and where: split, stage, task, step), ``WARN`` (allowed, but probably
not what you want) or ``SKIP`` (not applicable, e.g. no ``state_key``). The checks:

``class``            ``name`` and ``stages`` are set, ``super().__init__(horizon)`` was called
``make_tasks``       ``n`` tasks of every split and stage, with the right ``env`` / ``difficulty``, unique ids;
                     ``difficulty=None`` spreads them over the stages; unknown splits and stages are errors
``deterministic``    same arguments, same tasks (also from a fresh instance); another seed, other tasks; the same
                     task, the same episode
``json``             ``task.data`` survives JSON (RL stores its tasks as JSON) and replays the same episode
``reset/step``       ``reset`` starts a clean episode (``t == 0``, not ``done``, an :class:`Observation` with distinct
                     legal actions); ``step`` returns the gymnasium 5-tuple, counts ``t``, sets ``done``, sets
                     ``info["success"]`` (a bool) on the last step, and refuses a step after the end
``oracle``           the oracle solves every task of every split and stage within the horizon
``clone``            ``clone()`` is independent of the original (the data builder tries mistakes on clones)
``disjoint splits``  no problem of ``train`` appears in ``validation`` or ``test`` (nor of ``validation`` in
                     ``test``; a warning: a stage may have too few problems to split); two tasks pose the same
                     problem when the oracle plays them identically
``instance_key``     tasks that pose the same problem share a key (else held-out intervals are too narrow when
                     tasks repeat); the default key (``task_id``) is fine only while no task repeats another
``state_key``        hashable; equal after two different routes to one state (so: free of history and step count);
                     equal keys face the same future (actions, rewards, termination) under random action sequences
``reflector``        the oracle reflector names the oracle's action by its exact text at every decision point
                     (negative examples included), is seeded by its ``rng``, and writes no stop marker
``prompt budget``    every state offers at most as many actions as there are option labels, and the longest policy
                     prompt (observation + reflection + options) fits ``max_prompt_tokens`` (default 1024, the
                     tiny models' context; tokens with a tokenizer, else estimated from characters); also reports the longest reflection, which
                     ``reflection_max_new_tokens`` must exceed
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from reflect_trl.envs.base import SPLITS, Observation, Task, TextEnv
from reflect_trl.envs.check_base import (
    CHARS_PER_TOKEN,
    FAIL,
    PASS,
    SKIP,
    WARN,
    Check,
    ContractReport,
    EnvContractError,
    _Failed,
    _Played,
    _raised,
)
from reflect_trl.envs.check_semantics import SemanticChecks


class _Checker(SemanticChecks):
    def __init__(
        self,
        make: Callable[[], TextEnv],
        name: str,
        stages: Sequence[str] | None,
        n_tasks: int,
        seed: int,
        reflector: Any,
        tokenizer: Any,
        max_prompt_tokens: int,
        walks: int,
        labels: Sequence[str],
    ) -> None:
        self.make, self.name, self.n, self.seed = make, name, n_tasks, seed
        self.wanted_stages = list(stages) if stages else None
        self.reflector, self.tokenizer = reflector, tokenizer
        self.max_prompt_tokens, self.walks, self.labels = max_prompt_tokens, walks, tuple(labels)
        self.report = ContractReport(name)
        self.env: TextEnv | None = None
        self.stages: list[str] = []
        self.tasks: dict[tuple[str, str], list[Task]] = {}
        self.played: list[_Played] = []

    # -- running -------------------------------------------------------------------------------------------
    def run(self) -> ContractReport:
        for name, check, needs in (
            ("class", self.check_class, ()),
            ("make_tasks", self.check_make_tasks, ("class",)),
            ("deterministic", self.check_deterministic, ("make_tasks",)),
            ("json", self.check_json, ("make_tasks",)),
            ("reset/step", self.check_reset_step, ("make_tasks",)),
            ("oracle", self.check_oracle, ("reset/step",)),
            ("clone", self.check_clone, ("reset/step",)),
            ("disjoint splits", self.check_disjoint, ("oracle",)),
            ("instance_key", self.check_instance_key, ("oracle",)),
            ("state_key", self.check_state_key, ("reset/step",)),
            ("reflector", self.check_reflector, ("oracle",)),
            ("prompt budget", self.check_prompt_budget, ("oracle",)),
        ):
            blocked = [n for n in needs if self.report.status(n) in (FAIL, SKIP)]
            if blocked:
                self._add(name, SKIP, f"needs the {', '.join(blocked)} check to pass first")
                continue
            try:
                status, detail = check()
            except _Failed as failed:
                status, detail = FAIL, str(failed)
            except (
                Exception
            ) as err:  # a bug of the environment shows up as a failed check, with where it happened
                status, detail = FAIL, _raised("the check", err)
            self._add(name, status, detail)
        return self.report

    def _add(self, name: str, status: str, detail: str) -> None:
        self.report.checks.append(Check(name, status, detail))

    def _fresh(self) -> TextEnv:
        return self.make()

    def _all_tasks(self) -> Iterator[tuple[str, Task]]:
        for (split, _), tasks in self.tasks.items():
            for task in tasks:
                yield split, task

    # -- checks ----------------------------------------------------------------------------------------------
    def check_class(self) -> tuple[str, str]:
        try:
            env = self._fresh()
        except Exception as err:
            raise _Failed(_raised(f"making the environment {self.name!r}", err)) from err
        self.env = env
        cls = type(env)
        if not isinstance(env, TextEnv):
            raise _Failed(f"{cls.__qualname__} is not a subclass of reflect_trl.envs.TextEnv")
        if not cls.name:
            raise _Failed(f"{cls.__qualname__} sets no `name` (a class attribute: name = {self.name!r})")
        if cls.name != self.name:
            raise _Failed(f"{cls.__qualname__}.name is {cls.name!r}, but it is registered as {self.name!r}")
        stages = tuple(cls.stages)
        if not stages or len(set(stages)) != len(stages) or not all(isinstance(s, str) and s for s in stages):
            raise _Failed(f"`stages` must be distinct non-empty strings, easy first; got {stages!r}")
        missing = [a for a in ("horizon", "t", "done", "observation", "task") if not hasattr(env, a)]
        if missing:
            raise _Failed(
                f"the instance lacks {missing}: call super().__init__(horizon) first in {cls.__qualname__}.__init__"
            )
        unknown = [s for s in self.wanted_stages or () if s not in stages]
        if unknown:
            raise _Failed(f"--stages {unknown} are not stages of {self.name}: {list(stages)}")
        self.stages = self.wanted_stages or list(stages)
        return PASS, f"{cls.__module__}.{cls.__qualname__}, stages {list(stages)}, horizon {env.horizon}"

    def check_make_tasks(self) -> tuple[str, str]:
        env = self.env
        assert env is not None
        ids: dict[str, str] = {}
        for split in SPLITS:
            for stage in self.stages:
                try:
                    tasks = env.make_tasks(split, self.n, seed=self.seed, difficulty=stage)
                except Exception as err:
                    raise _Failed(
                        _raised(f"make_tasks({split!r}, {self.n}, difficulty={stage!r})", err)
                    ) from err
                where = f"make_tasks({split!r}, {self.n}, difficulty={stage!r})"
                if len(tasks) != self.n:
                    raise _Failed(f"{where} returned {len(tasks)} tasks")
                for task in tasks:
                    if not isinstance(task, Task):
                        raise _Failed(
                            f"{where} returned a {type(task).__name__}, not a reflect_trl.envs.Task"
                        )
                    if task.env != self.name or task.difficulty != stage:
                        raise _Failed(
                            f"{where}: task {task.task_id!r} has env {task.env!r} and difficulty "
                            f"{task.difficulty!r} (expected {self.name!r}, {stage!r})"
                        )
                    if task.task_id in ids:
                        raise _Failed(
                            f"task id {task.task_id!r} appears twice ({ids[task.task_id]} and {where})"
                        )
                    ids[task.task_id] = where
                self.tasks[(split, stage)] = tasks
        spread = env.make_tasks("train", max(self.n, len(env.stages)), seed=self.seed)
        status, note = PASS, ""
        missing = sorted(set(env.stages) - {t.difficulty for t in spread})
        if missing:
            status, note = (
                WARN,
                f"; difficulty=None gave no task of {missing} (it should spread over the stages)",
            )
        for call, args in (("an unknown split", ("dev", 1)), ("an unknown difficulty", ("train", 1))):
            kwargs = {"difficulty": "no_such_stage_xyz"} if call == "an unknown difficulty" else {}
            try:
                env.make_tasks(*args, seed=self.seed, **kwargs)
            except ValueError:
                continue
            except Exception as err:
                raise _Failed(_raised(f"make_tasks with {call}", err) + " (expected a ValueError)") from err
            status, note = WARN, note + f"; {call} gave tasks instead of a ValueError (self.check_difficulty)"
        total = len(ids)
        return status, f"{total} tasks: {self.n} per split ({', '.join(SPLITS)}) and stage{note}"

    def check_deterministic(self) -> tuple[str, str]:
        env, fresh = self.env, self._fresh()
        assert env is not None
        for (split, stage), tasks in self.tasks.items():
            again = env.make_tasks(split, self.n, seed=self.seed, difficulty=stage)
            other = fresh.make_tasks(split, self.n, seed=self.seed, difficulty=stage)
            for label, got in (("a second call", again), ("a fresh instance", other)):
                diff = next((i for i, (a, b) in enumerate(zip(tasks, got, strict=True)) if a != b), None)
                if diff is not None:
                    raise _Failed(
                        f"make_tasks({split!r}, {self.n}, seed={self.seed}, difficulty={stage!r}) differs on {label}:"
                        f" task {diff} is {tasks[diff]} then {got[diff]} (derive everything from split_seed)"
                    )
        stage = self.stages[0]
        reseeded = env.make_tasks("train", self.n, seed=self.seed + 1, difficulty=stage)
        if [t.seed for t in reseeded] == [t.seed for t in self.tasks[("train", stage)]]:
            return (
                WARN,
                f"same arguments, same tasks; but seed {self.seed + 1} gives the same tasks as seed {self.seed}",
            )
        return PASS, "same arguments, same tasks (also from a fresh instance); another seed, other tasks"

    def check_json(self) -> tuple[str, str]:
        for split, task in self._all_tasks():
            try:
                text = json.dumps(task.to_dict())
            except (TypeError, ValueError) as err:
                raise _Failed(
                    f"task {task.task_id!r} ({split}): task.data is not JSON-serialisable ({err}); RL stores tasks as "
                    "JSON: use lists, dicts, strings, numbers"
                ) from err
            back = Task.from_dict(json.loads(text))
            env_a, env_b = self._fresh(), self._fresh()
            if env_a.reset(seed=task.seed, task=task) != env_b.reset(seed=task.seed, task=back):
                raise _Failed(
                    f"task {task.task_id!r} ({split}): after a JSON round trip of the task, reset() shows another "
                    "observation (tuples become lists: convert task.data values in reset)"
                )
        return PASS, "every task survives JSON and replays the same first observation"

    def check_reset_step(self) -> tuple[str, str]:
        split, task = next(self._all_tasks())
        env = self._fresh()
        obs = env.reset(seed=task.seed, task=task)
        where = f"task {task.task_id!r} ({split}, {task.difficulty})"
        if not isinstance(obs, Observation):
            raise _Failed(f"reset() returned a {type(obs).__name__}, not an Observation ({where})")
        if env.observation != obs or env.t != 0 or env.done or env.task != task:
            raise _Failed(
                f"after reset(): observation set {env.observation == obs}, t={env.t}, done={env.done}, "
                f"task set {env.task == task} ({where}); set self.task, self.t = 0, self.done = False, "
                "self.observation"
            )
        if len(set(obs.actions)) != len(obs.actions) or not all(
            isinstance(a, str) and a for a in obs.actions
        ):
            raise _Failed(
                f"the legal actions must be distinct non-empty strings, got {list(obs.actions)} ({where})"
            )
        result = env.step(env.oracle_action())
        if not (isinstance(result, tuple) and len(result) == 5):
            raise _Failed(f"step() must return (observation, reward, terminated, truncated, info) ({where})")
        new_obs, reward, terminated, truncated, info = result
        problems = []
        if not isinstance(new_obs, Observation):
            problems.append(f"observation is a {type(new_obs).__name__}")
        if not isinstance(reward, int | float) or isinstance(reward, bool):
            problems.append(f"reward is a {type(reward).__name__}")
        if not isinstance(terminated, bool) or not isinstance(truncated, bool):
            problems.append("terminated/truncated are not bools")
        if not isinstance(info, dict):
            problems.append(f"info is a {type(info).__name__}")
        if env.t != 1:
            problems.append(f"t is {env.t} after one step (increment self.t in step)")
        if problems:
            raise _Failed(f"step(): {'; '.join(problems)} ({where})")
        return PASS, "reset starts a clean episode; step returns the gymnasium 5-tuple and counts t"

    def _play(self, split: str, task: Task, env: TextEnv, record_checks: bool = False) -> _Played:
        obs = env.reset(seed=task.seed, task=task)
        observations, actions, rewards = [obs], [], []
        info: dict[str, Any] = {}
        terminated = truncated = False
        while True:
            step = len(actions)
            where = f"task {task.task_id!r} ({split}, {task.difficulty}) at step {step}"
            try:
                action = env.oracle_action()
            except Exception as err:
                raise _Failed(_raised(f"oracle_action() on {where}", err)) from err
            if isinstance(action, bool) or not isinstance(action, int) or not 0 <= action < len(obs.actions):
                raise _Failed(
                    f"oracle_action() returned {action!r} on {where}: an index into the {len(obs.actions)} actions"
                )
            try:
                obs, reward, terminated, truncated, info = env.step(action)
            except Exception as err:
                raise _Failed(_raised(f"step({action}) on {where}", err)) from err
            actions.append(action)
            rewards.append(float(reward))
            if terminated or truncated:
                break
            observations.append(obs)
            if len(actions) > 10 * max(env.horizon, 1):
                raise _Failed(f"{where}: the episode never ends (set truncated at self.horizon)")
        if record_checks:
            where = f"task {task.task_id!r} ({split}, {task.difficulty})"
            if "success" not in info or not isinstance(info["success"], bool):
                raise _Failed(
                    f"{where}: the last step's info has success={info.get('success', '<missing>')!r}; set "
                    'info["success"] to a bool explicitly on every step'
                )
            if not env.done:
                raise _Failed(f"{where}: the episode ended but env.done is False (set self.done in step)")
            try:
                env.step(0)
            except RuntimeError:
                pass
            except Exception as err:
                raise _Failed(
                    _raised(f"step() after the end of {where}", err)
                    + " (expected the RuntimeError of self._check_action)"
                ) from err
            else:
                raise _Failed(
                    f"{where}: step() after the end of the episode was accepted (call self._check_action(i) first)"
                )
        success = bool(info.get("success", False))
        return _Played(
            split, task, observations, actions, rewards, success, bool(truncated and not terminated)
        )

    def check_oracle(self) -> tuple[str, str]:
        env = self._fresh()
        for split, task in self._all_tasks():
            played = self._play(split, task, env, record_checks=True)
            if not played.success:
                how = "was truncated at the horizon" if played.truncated else "ended without success"
                raise _Failed(
                    f"the oracle fails {played.where()}: the episode {how} after {len(played.actions)} steps "
                    f"(horizon {env.horizon}); last observation:\n    {played.observations[-1].text!r}"
                )
            self.played.append(played)
        for first in self.played[:: max(1, self.n // 3)]:
            second = self._play(first.split, first.task, self._fresh())
            if first.observations != second.observations or first.rewards != second.rewards:
                step = next(
                    (
                        i
                        for i, (a, b) in enumerate(zip(first.observations, second.observations, strict=False))
                        if a != b
                    ),
                    min(len(first.observations), len(second.observations)),
                )
                raise _Failed(
                    f"{first.where()}: two oracle episodes of the same task and seed differ at step {step} (randomness "
                    "that comes neither from task.seed nor from the reset seed)"
                )
        lengths = [len(p.actions) for p in self.played]
        self.report.facts["oracle_steps"] = (min(lengths), max(lengths))
        return PASS, (
            f"{len(self.played)} tasks of {len(SPLITS)} splits x {len(self.stages)} stages solved in "
            f"{min(lengths)}-{max(lengths)} steps (horizon {env.horizon}); episodes replay identically"
        )

    def check_clone(self) -> tuple[str, str]:
        played = self.played[0] if self.played else None
        split, task = (played.split, played.task) if played else next(self._all_tasks())
        env = self._fresh()
        obs = env.reset(seed=task.seed, task=task)
        clone = env.clone()
        if clone is env:
            raise _Failed("clone() returned the environment itself")
        for action in range(len(obs.actions)):
            probe = env.clone()
            probe.step(action)
        if env.observation != obs or env.t != 0 or env.done:
            raise _Failed(
                f"stepping clones changed the original (task {task.task_id!r}): clone() must return an independent "
                "copy (override it if the state cannot be deep-copied)"
            )
        if self._play(split, task, clone).actions != self._play(split, task, self._fresh()).actions:
            raise _Failed(
                f"a clone taken after reset plays task {task.task_id!r} differently from a fresh instance"
            )
        return PASS, "stepping clones leaves the original unchanged"

    def check_disjoint(self) -> tuple[str, str]:
        by_split: dict[str, dict[str, _Played]] = {s: {} for s in SPLITS}
        for played in self.played:
            by_split[played.split].setdefault(played.fingerprint(), played)
        overlaps = []
        for a, b in (("train", "test"), ("train", "validation"), ("validation", "test")):
            shared = sorted(set(by_split[a]) & set(by_split[b]))
            if shared:
                pa, pb = by_split[a][shared[0]], by_split[b][shared[0]]
                overlaps.append(
                    f"{len(shared)} problem(s) of {a} also appear in {b} (e.g. {pa.where()} = {pb.where()})"
                )
        if overlaps:
            return WARN, (
                "; ".join(overlaps)
                + ": held-out success then partly measures memorisation. Assign every problem to "
                "one split (e.g. by a stable hash of its content, see examples/lock_puzzle), unless a stage has too "
                "few problems to split (taxi's dropoff: 12 start states)"
            )
        return PASS, "no problem is shared by train, validation and test (among the tasks played)"


def check_env_contract(
    env: str | type[TextEnv],
    env_kwargs: dict[str, Any] | None = None,
    *,
    stages: Sequence[str] | None = None,
    n_tasks: int = 20,
    seed: int = 0,
    reflector: Any = None,
    tokenizer: Any = None,
    max_prompt_tokens: int = 1024,
    walks: int = 6,
    labels: Sequence[str] | None = None,
) -> ContractReport:
    """Check the contract of an environment (a registered name, or a :class:`TextEnv` subclass) and return the report.

    ``n_tasks`` tasks per split and stage are played with the oracle; ``reflector`` defaults to the environment's
    registered oracle reflector (skipped when it has none); ``tokenizer`` (a loaded tokenizer, or a path) counts
    prompt tokens, else they are estimated. ``report.ok`` is False when a check failed;
    ``report.raise_for_failures()`` raises :class:`EnvContractError` listing them (for your tests)."""
    from reflect_trl.prompts import DEFAULT_LABELS

    kwargs = dict(env_kwargs or {})
    if isinstance(env, str):
        from reflect_trl.envs import get_env_class

        cls = get_env_class(env)
        name = env
    else:
        cls, name = env, env.name
    if isinstance(tokenizer, str):
        from reflect_trl.models import load_tokenizer

        tokenizer = load_tokenizer(tokenizer)
    checker = _Checker(
        lambda: cls(**kwargs),
        name,
        stages,
        n_tasks,
        seed,
        reflector,
        tokenizer,
        max_prompt_tokens,
        walks,
        labels or DEFAULT_LABELS,
    )
    return checker.run()


__all__ = ["CHARS_PER_TOKEN", "Check", "ContractReport", "EnvContractError", "check_env_contract"]
