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
                     legal actions); ``step`` returns the gymnasium 5-tuple, counts ``t``, sets ``done`` and refuses
                     a step after the end
``options``          the same task and action sequence offer the same legal actions in the same order at every step:
                     after a second reset of one instance, in a fresh instance, and in fresh processes with other
                     ``PYTHONHASHSEED`` values (set iteration order of strings changes from process to process)
``info["success"]``  ``info["success"]`` is a bool on every step (oracle-led and random episodes), not only the last
``oracle``           the oracle solves every task of every split and stage within the horizon
``random policy``    the success rate of a uniformly random legal action on ``random_episodes`` test tasks per stage;
                     a warning when a stage reaches ``RANDOM_TOO_EASY`` (75 %): too easy to tell policies apart
``clone``            ``clone()`` is independent of the original (the data builder tries mistakes on clones)
``disjoint splits``  no problem of ``train`` appears in ``validation`` or ``test`` (nor of ``validation`` in
                     ``test``); two tasks pose the same problem when the oracle plays them identically. Some shared
                     problems are a warning (a stage may have too few problems to split); a split all of whose
                     problems appear in another is a failure (the splits are not split)
``instance_key``     tasks that pose the same problem share a key (else held-out intervals are too narrow when
                     tasks repeat); the default key (``task_id``) is fine only while no task repeats another
``state_key``        hashable; equal after two different routes to one state (so: free of history and step count);
                     equal keys face the same future (actions, rewards, termination) under random action sequences
``verified reward``  ``optimal_actions()`` at every state of oracle episodes and random walks is a non-empty set of
                     legal indices holding the oracle's action: ``reflection_reward: verified`` is available (SKIP
                     when not implemented: the reflection can then learn from the policy's advantage only)
``reflector``        the oracle reflector names the oracle's action by its exact text at every decision point
                     (negative examples included), is seeded by its ``rng``, and writes no stop marker
``prompt budget``    every state offers at most as many actions as there are option labels, and the longest policy
                     prompt (observation + reflection + options) fits ``max_prompt_tokens`` (default 1024, the
                     tiny models' context; tokens with a tokenizer, else estimated from characters); also reports the longest reflection, which
                     ``reflection_max_new_tokens`` must exceed
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
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

#: ``check-env``'s random-policy line warns when a uniformly random legal action solves this share of some stage's
#: test episodes: a trained policy then has too little room above chance to show anything (the scaffold's easiest
#: stage, a curriculum warm-up, is solved about half the time at random; a hand-written game that random play
#: solved 95-100 % taught nothing).
RANDOM_TOO_EASY = 0.75
#: ``PYTHONHASHSEED`` values of the processes that replay the options (the check compares them with this process).
HASH_SEEDS = (1, 2)
#: The measurement behind the option-lookup note of the options check.
OPTION_LOOKUP_STUDY = "docs/studies/2026-12-07_textworld_settings.md"
_OPTIONS_HINT_ORDER = (
    "options must not depend on set/dict iteration order or an unseeded RNG (build them in a fixed order)"
)
_OPTIONS_HINT_SET = (
    "the same task and actions must offer the same options (randomness that comes neither from task.seed nor "
    "from the reset seed)"
)


INFO = 'info["success"]'


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
        random_episodes: int = 50,
        random_threshold: float = RANDOM_TOO_EASY,
        target: tuple[str, dict[str, Any]] | None = None,
        hash_seeds: Sequence[int] = HASH_SEEDS,
    ) -> None:
        self.make, self.name, self.n, self.seed = make, name, n_tasks, seed
        self.random_episodes, self.random_threshold = random_episodes, random_threshold
        self.target, self.hash_seeds = target, tuple(hash_seeds)
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
            ("options", self.check_options, ("reset/step",)),
            (INFO, self.check_info, ("reset/step",)),
            ("oracle", self.check_oracle, ("reset/step", INFO)),
            ("random policy", self.check_random_policy, ("reset/step", INFO)),
            ("clone", self.check_clone, ("reset/step",)),
            ("disjoint splits", self.check_disjoint, ("oracle",)),
            ("instance_key", self.check_instance_key, ("oracle",)),
            ("state_key", self.check_state_key, ("reset/step",)),
            ("verified reward", self.check_verified_reward, ("oracle",)),
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

    # -- options: the same state, the same list ----------------------------------------------------------------
    def _options_tasks(self) -> list[tuple[str, Task]]:
        """The first task of every split and stage."""
        return [(split, tasks[0]) for (split, _), tasks in self.tasks.items() if tasks]

    def _options_walk(
        self, env: TextEnv, task: Task, rng: random.Random
    ) -> tuple[list[list[str]], list[int]]:
        """A seeded walk of ``task`` (the oracle's action half of the time, else a random one): the legal actions at
        every decision point and the actions taken."""
        obs = env.reset(seed=task.seed, task=task)
        lists, taken = [list(obs.actions)], []
        while len(taken) <= 2 * max(env.horizon, 1):
            action = rng.randrange(len(obs.actions))
            if rng.random() < 0.5:
                try:
                    oracle = env.oracle_action()
                except Exception:  # the oracle check reports it
                    oracle = None
                if isinstance(oracle, int) and 0 <= oracle < len(obs.actions):
                    action = oracle
            obs, _, terminated, truncated, _ = env.step(action)
            taken.append(action)
            if terminated or truncated:
                break
            lists.append(list(obs.actions))
        return lists, taken

    @staticmethod
    def _compare_options(
        first: list[list[str]], second: list[list[str]], where: str, between: str, hint: str
    ) -> None:
        for step, (a, b) in enumerate(zip(first, second, strict=False)):
            if a != b:
                in_order = sorted(a) == sorted(b)
                raise _Failed(
                    f"{where}: the actions at step {step} differ{' in order' if in_order else ''} between {between}: "
                    f"{a} vs {b}; {hint if in_order else _OPTIONS_HINT_SET}"
                )

    def check_options(self) -> tuple[str, str]:
        rng = random.Random(f"{self.seed}/options")
        walks = []
        for split, task in self._options_tasks():
            where = f"task {task.task_id!r} ({split}, {task.difficulty})"
            env = self._fresh()
            lists, taken = self._options_walk(env, task, rng)
            again, _ = _replay_options(env, task, taken)
            self._compare_options(lists, again, where, "two resets of the same task", _OPTIONS_HINT_ORDER)
            fresh, _ = _replay_options(self._fresh(), task, taken)
            self._compare_options(
                lists, fresh, where, "two instances playing the same task", _OPTIONS_HINT_ORDER
            )
            walks.append((split, task, taken, lists))
        steps = sum(len(lists) for *_, lists in walks)
        detail = f"{len(walks)} tasks x {steps} decision points: the same options in the same order after a second reset and in a fresh instance"
        note = self._options_in_processes(walks)
        distinct = {tuple(options) for *_, lists in walks for options in lists}
        self.report.facts["distinct_option_lists"] = len(distinct)
        return PASS, f"{detail}{note}; {option_lists_note(len(distinct), steps)}"

    def _options_in_processes(self, walks: list[tuple[str, Task, list[int], list[list[str]]]]) -> str:
        """Replay the walks in fresh processes with other ``PYTHONHASHSEED`` values; raises on a difference, returns
        a note on what was compared (or why not)."""
        if not self.hash_seeds:
            return ""
        if self.target is None:
            return "; not replayed in other processes (the class is not importable by its module path)"
        target, kwargs = self.target
        try:
            payload = json.dumps(
                {"target": target, "kwargs": kwargs, "walks": [[t.to_dict(), a] for _, t, a, _ in walks]}
            )
        except (TypeError, ValueError):
            return "; not replayed in other processes (env_kwargs or task.data are not JSON)"
        environ = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        code = "from reflect_trl.envs.check import _replay_options_main; _replay_options_main()"
        runs = []
        for seed in self.hash_seeds:
            with tempfile.TemporaryFile(
                "w+", encoding="utf-8"
            ) as request:  # each process its own file offset
                request.write(payload)
                request.seek(0)
                runs.append(
                    (
                        seed,
                        subprocess.Popen(
                            [sys.executable, "-c", code],
                            stdin=request,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            text=True,
                            env={**environ, "PYTHONHASHSEED": str(seed)},
                        ),
                    )
                )
        replayed: dict[int, list[list[list[str]]]] = {}
        problem = ""
        for seed, proc in runs:  # the processes run side by side
            if problem:
                proc.kill()
                proc.communicate()
                continue
            try:
                out, err = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                out, err = "", "it took over 120 s"
            if proc.returncode != 0 or not out.strip():
                problem = f"PYTHONHASHSEED={seed}: {(err.strip().splitlines() or ['no output'])[-1]}"
            else:
                replayed[seed] = json.loads(out.strip().splitlines()[-1])
        if problem:
            return f"; not replayed in other processes ({problem})"
        for seed, lists_of_walks in replayed.items():
            for (split, task, _, lists), other in zip(walks, lists_of_walks, strict=True):
                where = f"task {task.task_id!r} ({split}, {task.difficulty})"
                self._compare_options(
                    lists,
                    other,
                    where,
                    f"this process and a fresh one with PYTHONHASHSEED={seed}",
                    "options must not depend on set iteration order (string hashes change from process to process: "
                    "data built in one process and RL in another would label the options differently) or an "
                    "unseeded RNG; build them in a fixed order (e.g. sorted)",
                )
        return f", and in fresh processes with PYTHONHASHSEED={', '.join(map(str, self.hash_seeds))}"

    # -- info["success"] on every step ---------------------------------------------------------------------------
    def check_info(self) -> tuple[str, str]:
        rng = random.Random(f"{self.seed}/info")
        episodes = steps = 0
        for stage in self.stages:
            task = self.tasks[("train", stage)][0]
            for policy in ("oracle-led", "random", "random"):
                env = self._fresh()
                obs = env.reset(seed=task.seed, task=task)
                episodes += 1
                for step in range(10 * max(env.horizon, 1) + 1):
                    where = f"task {task.task_id!r} (train, {stage}), step {step} of a{'n' if policy[0] == 'o' else ''} {policy} episode"
                    action = rng.randrange(len(obs.actions))
                    if policy == "oracle-led":
                        try:
                            oracle = env.oracle_action()
                        except Exception:  # the oracle check reports it
                            oracle = None
                        if isinstance(oracle, int) and 0 <= oracle < len(obs.actions):
                            action = oracle
                    try:
                        obs, _, terminated, truncated, info = env.step(action)
                    except Exception as err:
                        raise _Failed(_raised(f"step({action}) at {where}", err)) from err
                    steps += 1
                    if not isinstance(info, dict) or "success" not in info:
                        keys = sorted(info) if isinstance(info, dict) else f"info is a {type(info).__name__}"
                        raise _Failed(
                            f'{where}: info has no "success" (keys present: {keys}); set info["success"] to a bool '
                            "explicitly on every step, not only the last (False until the task is solved)"
                        )
                    if not isinstance(info["success"], bool):
                        raise _Failed(
                            f'{where}: info["success"] is {info["success"]!r} (a {type(info["success"]).__name__}); '
                            "it must be a bool (bool(...))"
                        )
                    if terminated or truncated:
                        break
                else:
                    raise _Failed(f"{where}: the episode never ends (set truncated at self.horizon)")
        return (
            PASS,
            f'info["success"] is a bool on all {steps} steps of {episodes} oracle-led and random episodes',
        )

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

    # -- the random policy's success ----------------------------------------------------------------------------
    def check_random_policy(self) -> tuple[str, str]:
        if self.random_episodes < 1:
            return SKIP, "random_episodes is 0"
        env = self._fresh()
        rates: dict[str, float] = {}
        for stage in self.stages:
            tasks = env.make_tasks("test", self.random_episodes, seed=self.seed, difficulty=stage)
            rng = random.Random(f"{self.seed}/random policy/{stage}")
            wins = 0
            for task in tasks:
                obs = env.reset(seed=task.seed, task=task)
                info: dict[str, Any] = {}
                for step in range(10 * max(env.horizon, 1) + 1):
                    action = rng.randrange(len(obs.actions))
                    where = f"task {task.task_id!r} (test, {stage}) at step {step}"
                    try:
                        obs, _, terminated, truncated, info = env.step(action)
                    except Exception as err:
                        raise _Failed(_raised(f"the legal action {action} on {where}", err)) from err
                    if terminated or truncated:
                        break
                else:
                    raise _Failed(f"{where}: a random episode never ends (set truncated at self.horizon)")
                wins += info.get("success") is True
            rates[stage] = wins / len(tasks)
        self.report.facts["random_success"] = rates
        solved = ", ".join(f"{stage} {rate:.0%}" for stage, rate in rates.items())
        detail = f"solves {solved} of {self.random_episodes} test tasks per stage, a uniformly random legal action each step"
        easy = [stage for stage, rate in rates.items() if rate >= self.random_threshold]
        if easy:
            return WARN, (
                f"{detail}: {easy} at or above {self.random_threshold:.0%}, too easy to show what a trained policy "
                "learns (little room between chance and the oracle); make the stage harder (a longer way to the goal, "
                "more options, actions that end the episode in failure, a horizon closer to the oracle's steps)"
            )
        return PASS, detail

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
            if shared and len(shared) == len(by_split[b]):
                pa, pb = by_split[a][shared[0]], by_split[b][shared[0]]
                raise _Failed(
                    f"every problem of {b} also appears in {a}: all {len(shared)} distinct problems of the {b} tasks "
                    f"played, over {len(self.stages)} stage(s) (e.g. {pa.where()} = {pb.where()}): {b} success would "
                    "measure memorisation only. make_tasks must give each split its own problems: derive task seeds "
                    "with split_seed(seed, split, i) and assign every problem to one split (e.g. by a stable hash of "
                    "its content, see examples/lock_puzzle)"
                )
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


def option_lists_note(distinct: int, count: int, over: str = "decision points") -> str:
    """What the variety of option lists asks of the policy: a fixed label per move, or an in-context lookup.
    ``count`` is the number of ``over`` (decision points of a walk, policy prompts of a data set) looked at."""
    if distinct <= 1:
        return f"one option list over all {count} {over} (each move keeps its label)"
    return (
        f"{distinct} different option lists over {count} {over}: the policy must find the move "
        f"its reflection names in the list (an in-context lookup), which the tiny self-built models learned only "
        f"after an SFT warm-up on `reflect-trl lookup-data` rows ({OPTION_LOOKUP_STUDY})"
    )


def _replay_options(env: TextEnv, task: Task, actions: Sequence[int]) -> tuple[list[list[str]], bool]:
    """The legal actions at every decision point of ``actions`` played on ``task`` (and whether it ended)."""
    obs = env.reset(seed=task.seed, task=task)
    lists = [list(obs.actions)]
    for action in actions:
        if not 0 <= action < len(obs.actions):
            return lists, False
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            return lists, True
        lists.append(list(obs.actions))
    return lists, False


def _replay_options_main() -> None:
    """The other process of the ``options`` check: reads ``{"target", "kwargs", "walks"}`` (JSON) from stdin, prints
    the legal actions of every walk (JSON)."""
    import importlib

    request = json.loads(sys.stdin.read())
    module, _, qualname = request["target"].partition(":")
    cls: Any = importlib.import_module(module)
    for part in qualname.split("."):
        cls = getattr(cls, part)
    out = [
        _replay_options(cls(**request["kwargs"]), Task.from_dict(task), actions)[0]
        for task, actions in request["walks"]
    ]
    print(json.dumps(out))


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
    random_episodes: int = 50,
    random_threshold: float = RANDOM_TOO_EASY,
    hash_seeds: Sequence[int] = HASH_SEEDS,
) -> ContractReport:
    """Check the contract of an environment (a registered name, or a :class:`TextEnv` subclass) and return the report.

    ``n_tasks`` tasks per split and stage are played with the oracle; ``reflector`` defaults to the environment's
    registered oracle reflector (skipped when it has none); ``tokenizer`` (a loaded tokenizer, or a path) counts
    prompt tokens, else they are estimated. ``random_episodes`` test tasks per stage are played with a uniformly
    random legal action (0: skip), a warning at ``random_threshold`` success on some stage. ``hash_seeds``: the
    ``PYTHONHASHSEED`` values of the fresh processes that replay the options (empty: none). ``report.ok`` is False when a check failed;
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
        random_episodes=random_episodes,
        random_threshold=random_threshold,
        target=_importable(cls, kwargs),
        hash_seeds=hash_seeds,
    )
    return checker.run()


def _importable(cls: type, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """``("module:Qual.Name", kwargs)`` when a fresh process can import ``cls`` by its module path, else None."""
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        return None
    return f"{cls.__module__}:{cls.__qualname__}", kwargs


__all__ = [
    "CHARS_PER_TOKEN",
    "HASH_SEEDS",
    "RANDOM_TOO_EASY",
    "Check",
    "ContractReport",
    "EnvContractError",
    "check_env_contract",
]
