"""The contract checks of :func:`reflect_trl.envs.check.check_env_contract` that read the meaning of an environment:
``instance_key`` and ``state_key`` (two routes to one state share a key, the history stays out of it), the optimal
actions (what the verified reflection reward checks), the oracle reflector (it names the oracle's action) and the
prompt budget (observation and option counts fit the context)."""

from __future__ import annotations

import math
import random
from collections.abc import Hashable
from typing import Any

from reflect_trl.envs.base import Observation, TextEnv
from reflect_trl.envs.check_base import (
    CHARS_PER_TOKEN,
    FAIL,
    PASS,
    SKIP,
    WARN,
    _Failed,
    _Played,
    _raised,
)


class SemanticChecks:
    """Checks of the meaning of the keys, the reflector and the prompt budget (a mixin of the contract checker)."""

    def check_instance_key(self) -> tuple[str, str]:
        env = self._fresh()
        overridden = type(env).instance_key is not TextEnv.instance_key
        keys: dict[str, set[str]] = {}  # fingerprint -> instance keys
        examples: dict[str, list[_Played]] = {}
        for played in self.played:
            try:
                key = env.instance_key(played.task)
                again = self._fresh().instance_key(played.task)
            except Exception as err:
                raise _Failed(_raised(f"instance_key({played.task.task_id!r})", err)) from err
            if not isinstance(key, Hashable) or key != again:
                raise _Failed(
                    f"instance_key({played.task.task_id!r}) is not a stable hashable value: {key!r}, {again!r}"
                )
            fingerprint = f"{played.split}/{played.fingerprint()}"
            keys.setdefault(fingerprint, set()).add(str(key))
            examples.setdefault(fingerprint, []).append(played)
        repeated = {f: ps for f, ps in examples.items() if len(ps) > 1}
        split_keys = [keys[f] for f in repeated]
        if repeated and not overridden:
            first = next(iter(repeated.values()))
            return FAIL, (
                f"{sum(len(ps) - 1 for ps in repeated.values())} of {len(self.played)} tasks repeat another task's problem "
                f"(e.g. {first[0].where()} and {first[1].task.task_id!r}), but instance_key is the default (task_id): "
                "held-out success intervals count repeats as independent and come out too narrow. Override "
                "instance_key(task) to return a key of the problem (e.g. its stage and start state)"
            )
        if any(len(k) > 1 for k in split_keys):
            fingerprint = next(f for f in repeated if len(keys[f]) > 1)
            ps = repeated[fingerprint]
            raise _Failed(
                f"{ps[0].where()} and {ps[1].task.task_id!r} pose the same problem but get instance keys "
                f"{sorted(keys[fingerprint])}: the key must name the problem, not the task"
            )
        by_key: dict[tuple[str, str], set[str]] = {}
        for fingerprint, ks in keys.items():
            for k in ks:
                by_key.setdefault((fingerprint.split("/", 1)[0], k), set()).add(fingerprint)
        coarse = [k for k, fs in by_key.items() if len(fs) > 1]
        if coarse:
            return WARN, (
                f"instance key {coarse[0][1]!r} ({coarse[0][0]}) is shared by {len(by_key[coarse[0]])} tasks the oracle "
                "plays differently: is the key too coarse?"
            )
        if not overridden:
            return (
                PASS,
                f"the default (task_id): no task repeats another's problem among {len(self.played)} tasks",
            )
        return PASS, (
            f"{len(by_key)} instance keys for {len(self.played)} tasks; tasks that pose one problem share a key"
            + (f" ({sum(len(ps) for ps in repeated.values())} tasks are repeats)" if repeated else "")
        )

    def check_state_key(self) -> tuple[str, str]:
        split, task = next(self._all_tasks())
        env = self._fresh()
        env.reset(seed=task.seed, task=task)
        try:
            key = env.state_key()
        except NotImplementedError:
            return SKIP, "not implemented (only advantage_estimator: gigpo needs it)"
        except Exception as err:
            raise _Failed(_raised("state_key() after reset", err)) from err
        try:
            hash(key)
        except TypeError as err:
            raise _Failed(f"state_key() returned an unhashable {type(key).__name__}: {key!r}") from err
        if env.clone().state_key() != key:
            raise _Failed("state_key() of a clone differs from the original's")
        rng = random.Random(self.seed)
        visits: dict[Any, tuple[tuple[int, ...], TextEnv]] = {}
        pairs: list[tuple[tuple[int, ...], TextEnv, tuple[int, ...], TextEnv]] = []
        n_visits = 0
        tasks = [t for (s, _), ts in self.tasks.items() if s == "train" for t in ts[:3]]
        for task in tasks:
            for _ in range(self.walks):
                walker = self._fresh()
                obs = walker.reset(seed=task.seed, task=task)
                route: tuple[int, ...] = ()
                while not walker.done and len(route) <= walker.horizon:
                    key = (task.task_id, walker.state_key())
                    n_visits += 1
                    seen = visits.get(key)
                    if seen is None:
                        visits[key] = (route, walker.clone())
                    elif seen[0] != route and len(pairs) < 40:
                        pairs.append((seen[0], seen[1], route, walker.clone()))
                    action = self._walk_action(walker, obs, rng)
                    obs, *_ = walker.step(action)
                    route += (action,)
        if not pairs:
            return WARN, (
                f"no two different routes reached one key in {n_visits} visits of random walks: if states can repeat, "
                "the key holds the history or the step counter (GiGPO then finds no step groups)"
            )
        for route_a, a, route_b, b in pairs:
            self._same_future(
                a, b, rng, f"routes {list(route_a)} and {list(route_b)} of task {a.task.task_id!r}"
            )
        if all(len(ra) == len(rb) for ra, _, rb, _ in pairs):
            return WARN, (
                f"equal keys were reached only after equal numbers of steps ({len(pairs)} pairs of routes in {n_visits} "
                "visits): does the key hold the step counter? Visits of one state at different turns then never share "
                "a GiGPO step group"
            )
        return PASS, (
            f"{len(pairs)} pairs of different routes reached equal keys in {n_visits} visits, and every pair faced the "
            "same future"
        )

    def check_verified_reward(self) -> tuple[str, str]:
        """``optimal_actions()`` at every state of the oracle's episodes and of random walks: a non-empty set of legal
        indices that holds the oracle's action (what ``reflection_reward: verified`` rewards a reflection for naming)."""
        rng = random.Random(f"{self.seed}/verified reward")
        sizes: list[int] = []
        for played in self.played[: max(1, 2 * self.walks)]:
            for walk in (False, True):
                env = self._fresh()
                obs = env.reset(seed=played.task.seed, task=played.task)
                while not env.done and len(sizes) < 10_000:
                    where = f"{played.where()}, step {env.t}{' of a random walk' if walk else ''}"
                    try:
                        best = env.optimal_actions()
                    except NotImplementedError:
                        return SKIP, (
                            "optimal_actions() is not implemented: reflection_reward 'verified' / 'mixed' and "
                            "reflection_objective 'oracle_sft' are unavailable (use 'advantage')"
                        )
                    except Exception as err:
                        raise _Failed(_raised(f"optimal_actions() at {where}", err)) from err
                    legal = range(len(obs.actions))
                    if not best or not set(best) <= set(legal):
                        raise _Failed(
                            f"optimal_actions() at {where} returned {sorted(best)!r}: it must be a non-empty set of "
                            f"indices of the {len(obs.actions)} legal actions"
                        )
                    oracle = env.oracle_action()
                    if oracle not in best:
                        raise _Failed(
                            f"optimal_actions() at {where} is {sorted(best)!r} but the oracle takes {oracle}: the "
                            "oracle's action must be one of the optimal ones"
                        )
                    sizes.append(len(best))
                    action = self._walk_action(env, obs, rng) if walk else oracle
                    obs, *_ = env.step(action)
        return PASS, (
            f"reflection_reward 'verified' available: optimal_actions() at {len(sizes)} states of oracle episodes and "
            f"random walks, {min(sizes)}-{max(sizes)} optimal of the legal actions, the oracle's always among them"
        )

    @staticmethod
    def _walk_action(env: TextEnv, obs: Observation, rng: random.Random) -> int:
        """A random action that does not end the episode when there is one (the oracle's half of the time)."""
        if rng.random() < 0.5:
            return env.oracle_action()
        candidates = list(range(len(obs.actions)))
        rng.shuffle(candidates)
        for action in candidates:
            probe = env.clone()
            _, _, terminated, truncated, _ = probe.step(action)
            if not (terminated or truncated):
                return action
        return candidates[0]

    def _same_future(self, a: TextEnv, b: TextEnv, rng: random.Random, where: str) -> None:
        for _ in range(3):
            x, y = a.clone(), b.clone()
            budget = max(a.horizon, 1)
            x.horizon = y.horizon = max(x.t, y.t) + budget + 1  # the step counter is not part of the state
            assert x.observation is not None and y.observation is not None
            for step in range(budget):
                if x.observation.actions != y.observation.actions:
                    raise _Failed(
                        f"state_key: {where} have equal keys but offer {list(x.observation.actions)} vs "
                        f"{list(y.observation.actions)} after {step} more steps"
                    )
                action = rng.randrange(len(x.observation.actions))
                _, ra, ta, _, ia = x.step(action)
                _, rb, tb, _, ib = y.step(action)
                if (ra, ta, ia.get("success")) != (rb, tb, ib.get("success")):
                    raise _Failed(
                        f"state_key: {where} have equal keys but action {action} then gives reward/terminated/success "
                        f"{(ra, ta, ia.get('success'))} vs {(rb, tb, ib.get('success'))}: the key misses part of the state"
                    )
                if ta:
                    break
                if x.state_key() != y.state_key():
                    raise _Failed(
                        f"state_key: {where} have equal keys but not after the same action {action}"
                    )

    def _reflector(self) -> tuple[Any, str | None]:
        if self.reflector is not None:
            return self.reflector, None
        from reflect_trl.reflection import get_oracle_reflector

        try:
            return get_oracle_reflector(self.name), None
        except KeyError:
            return (
                None,
                "no oracle reflector is registered (reflect_trl.reflectors); data needs the teacher then",
            )

    def _records(self) -> list[Any]:
        """Oracle trajectories with injected mistakes of some validation tasks, as the data builder plays them."""
        from reflect_trl.data.builder import play_trajectory
        from reflect_trl.seeding import derive_seed

        reflector, _ = self._reflector()
        records = []
        for (split, _stage), tasks in self.tasks.items():
            if split != "validation":
                continue
            for task in tasks:
                env = self._fresh()
                seed = derive_seed(self.seed, task.task_id, "reflection")
                positive, _, _ = play_trajectory(env, task, reflector, seed)
                inject = random.Random(derive_seed(self.seed, task.task_id, "inject"))
                negative, _, _ = play_trajectory(env, task, reflector, seed, [0], inject)
                records += [(task, r) for r in positive + negative]
        return records

    def check_reflector(self) -> tuple[str, str]:
        from reflect_trl.prompts import STOP_MARKER

        reflector, missing = self._reflector()
        if reflector is None:
            return SKIP, missing or ""
        if not callable(getattr(reflector, "reflect", None)):
            raise _Failed(f"{type(reflector).__name__} has no reflect(ctx, rng) method")
        try:
            records = self._records()
        except _Failed:
            raise
        except Exception as err:
            raise _Failed(
                _raised("the reflector, playing validation tasks as the data builder does,", err)
            ) from err
        self._reflection_records = records
        named = negatives = 0
        for task, record in records:
            text, oracle_text = record.reflection, record.observation.actions[record.oracle_action]
            where = f"task {task.task_id!r} (validation, {task.difficulty}) at step {record.step}"
            if not isinstance(text, str) or not text.strip():
                raise _Failed(f"the reflection at {where} is empty")
            if STOP_MARKER in text:
                raise _Failed(
                    f"the reflection at {where} contains the stop marker {STOP_MARKER!r}: the builder adds it"
                )
            if oracle_text not in text:
                raise _Failed(
                    f"the reflection at {where} does not name the oracle's action by its exact text {oracle_text!r}: "
                    f"{text!r}"
                )
            named += 1
            negatives += record.is_negative
        again = self._records()
        if [r.reflection for _, r in again] != [r.reflection for _, r in records]:
            raise _Failed(
                "two runs with the same rng seeds wrote different reflections: draw every choice from `rng`"
            )
        return PASS, (
            f"{type(reflector).__name__} names the oracle's action at all {named} decision points of "
            f"{len({t.task_id for t, _ in records})} validation tasks ({negatives} right after an injected mistake); "
            "seeded"
        )

    def _length(self, text: str) -> tuple[int, bool]:
        """(tokens, exact): counted with the tokenizer, else estimated from characters."""
        if self.tokenizer is not None:
            return len(self.tokenizer(text)["input_ids"]), True
        return math.ceil(len(text) / CHARS_PER_TOKEN), False

    def check_prompt_budget(self) -> tuple[str, str]:
        from reflect_trl.prompts import build_prompt, with_stop

        records = getattr(self, "_reflection_records", None)
        if records is None:  # no reflector: the prompts without reflections
            states = [(p.task, o, None) for p in self.played for o in p.observations]
        else:
            states = [(t, r.observation, r.reflection) for t, r in records]
        options = max(len(o.actions) for _, o, _ in states)
        if options > len(self.labels):
            task, obs, _ = next(s for s in states if len(s[1].actions) == options)
            raise _Failed(
                f"task {task.task_id!r} offers {options} actions, more than the {len(self.labels)} option labels "
                "(option_labels)"
            )
        longest_prompt = max(
            ((self._length(build_prompt(o.text, o.actions, r).text), t) for t, o, r in states),
            key=lambda x: x[0],
        )
        (prompt_tokens, exact), task = longest_prompt
        reflection_tokens = max(
            (self._length(with_stop(r))[0] for _, _, r in states if r is not None), default=0
        )
        unit = (
            "tokens"
            if exact
            else f"tokens (estimated: {CHARS_PER_TOKEN:g} characters per token; --tokenizer counts)"
        )
        self.report.facts.update(
            max_options=options, max_prompt_tokens=prompt_tokens, max_reflection_tokens=reflection_tokens
        )
        detail = f"at most {options} options; longest policy prompt {prompt_tokens} {unit}" + (
            f"; longest reflection {reflection_tokens} tokens with the stop marker: set "
            f"reflection_max_new_tokens above it"
            if reflection_tokens
            else ""
        )
        if prompt_tokens > self.max_prompt_tokens:
            message = (
                f"{detail}: above max_prompt_tokens {self.max_prompt_tokens} (task {task.task_id!r}); shorten the "
                "observation or raise max_length / max_prompt_length and use a model with a longer context"
            )
            if exact:
                raise _Failed(message)
            return WARN, message
        return PASS, detail
