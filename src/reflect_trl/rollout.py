"""Lock-step, batched two-player rollouts (used by RL training, evaluation and the benchmark).

One turn for all live episodes at once:

1. render the state of every live episode;
2. the frozen reflection model writes all reflections in one batched, KV-cached ``generate`` (skipped for
   the "without reflection" variants);
3. the policy prompts (state + reflection + enumerated options) go through ONE forward pass of the policy
   that keeps only the last position's logits, restricted to the option-label tokens;
4. sample (or argmax) one option per episode and step the environments.

Finished episodes simply drop out of the next turn's batch (compaction): nothing is re-padded or
recomputed for them.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from reflect_trl.action_head import OptionHead
from reflect_trl.batching import DEFAULT_SHARED_PREFIX_MIN_TOKENS
from reflect_trl.envs import Task, TextEnv, make_env
from reflect_trl.envs.base import Observation
from reflect_trl.prompts import (
    PolicyPrompt,
    build_prompt,
    encode_prompts,
    options_block,
    reflection_prompt,
    with_stop,
)
from reflect_trl.reflection.base import ReflectionContext, Reflector
from reflect_trl.reflection.player import ReflectionPlayer
from reflect_trl.rl_math import entropy_from_log_probs
from reflect_trl.seeding import derive_seed


@dataclass
class Turn:
    """One decision of the policy (one RL training sample)."""

    step: int
    state_text: str
    actions: tuple[str, ...]
    reflection: str | None
    prompt_ids: list[int]
    num_options: int
    option: int  # position of the chosen label in the prompt
    action_index: int  # index into ``actions``
    logprob: float
    entropy: float
    reward: float = 0.0
    value: float | None = None
    reflection_tokens: int = 0
    reflection_stopped: bool = True
    label_token: int = -1
    #: ``env.state_key()`` before the action (recorded when the engine is asked to, e.g. for gigpo)
    state_key: Hashable | None = None
    #: every optimal action of the state (``env.optimal_actions()``; recorded when the engine is asked to)
    optimal_actions: tuple[int, ...] | None = None
    #: a trained reflection player's prompt, generated tokens and their log-probs at sampling time
    reflection_prompt_ids: tuple[int, ...] = ()
    reflection_ids: tuple[int, ...] = ()
    reflection_logps: tuple[float, ...] = ()
    #: the oracle reflector's reflection at this state (recorded when the engine has a ``teacher``)
    teacher_reflection: str | None = None

    @property
    def action_text(self) -> str:
        return self.actions[self.action_index]


@dataclass
class Episode:
    task: Task
    seed: int
    group: int = 0
    turns: list[Turn] = field(default_factory=list)
    success: bool = False
    crashed: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def total_return(self) -> float:
        return float(sum(t.reward for t in self.turns))

    @property
    def length(self) -> int:
        return len(self.turns)

    def transcript(self) -> dict[str, Any]:
        """A readable record of the episode (JSON-serialisable)."""
        return {
            "task": self.task.to_dict(),
            "seed": self.seed,
            "success": self.success,
            "crashed": self.crashed,
            "truncated": self.truncated,
            "return": self.total_return,
            "length": self.length,
            "turns": [
                {
                    "step": t.step,
                    "state": t.state_text,
                    "reflection": t.reflection,
                    "options": list(t.actions),
                    "action": t.action_text,
                    "action_index": t.action_index,
                    "logprob": t.logprob,
                    "reward": t.reward,
                    **({"optimal": list(t.optimal_actions)} if t.optimal_actions is not None else {}),
                }
                for t in self.turns
            ],
        }


@dataclass(frozen=True)
class LiveEpisode:
    """One live episode at the current turn, as the engine hands it to the actor: its environment (before the
    action), the episode so far, this turn's policy prompt and reflection (None without a reflection player). Model
    actors ignore it; scripted actors (:mod:`reflect_trl.scripted_actors`: the oracle, random and reflection-following
    policies of evaluation) choose from it."""

    env: TextEnv
    episode: Episode
    prompt: PolicyPrompt
    reflection: str | None = None


class Actor(Protocol):
    """What the engine needs from the player that chooses the actions: ``tokenizer`` (None for an actor that reads
    no token ids: the engine then skips tokenizing the policy prompts), the option ``labels`` shown in the prompts,
    and ``act`` (one option per live episode, with log-probs, entropies and optional values).
    """

    tokenizer: Any

    @property
    def labels(self) -> tuple[str, ...]: ...

    def act(
        self,
        prompt_ids: Sequence[Sequence[int]],
        num_options: Sequence[int],
        live: Sequence[LiveEpisode] | None = None,
    ) -> tuple[list[int], list[float], list[float], list[float] | None]: ...


class PolicyActor:
    """The policy player: the option-restricted head over one forward pass (:func:`reflect_trl.action_head.option_forward`,
    shared prompt prefix encoded once), optional value head on the last hidden state."""

    def __init__(
        self,
        model,
        tokenizer,
        option_head: OptionHead,
        temperature: float = 1.0,
        greedy: bool = False,
        value_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
        shared_prefix_min_tokens: int = DEFAULT_SHARED_PREFIX_MIN_TOKENS,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.option_head = option_head
        self.temperature = temperature
        self.greedy = greedy
        self.value_fn = value_fn
        self.shared_prefix_min_tokens = shared_prefix_min_tokens

    @property
    def labels(self) -> tuple[str, ...]:
        """The option labels the head scores (the engine shows exactly these in the prompts)."""
        return self.option_head.labels

    @torch.no_grad()
    def act(
        self,
        prompt_ids: Sequence[Sequence[int]],
        num_options: Sequence[int],
        live: Sequence[LiveEpisode] | None = None,
    ) -> tuple[list[int], list[float], list[float], list[float] | None]:
        """Choose one option per prompt (``live`` is not needed here). Returns (options, log-probs, entropies,
        values or None)."""
        scored = self.option_head.forward(
            self.model,
            prompt_ids,
            list(num_options),
            temperature=self.temperature,
            shared_prefix_min_tokens=self.shared_prefix_min_tokens,
            output_hidden_states=self.value_fn is not None,
        )
        options = OptionHead.select(scored.log_probs, greedy=self.greedy)
        chosen = scored.log_probs.gather(-1, options[:, None]).squeeze(-1)
        entropy = entropy_from_log_probs(scored.log_probs)
        values = None
        if self.value_fn is not None:
            values = self.value_fn(scored.hidden).float().view(-1).tolist()
        return options.tolist(), chosen.float().tolist(), entropy.float().tolist(), values


@dataclass
class RolloutTimings:
    reflection_s: float = 0.0
    policy_s: float = 0.0
    env_s: float = 0.0
    tokenize_s: float = 0.0
    reflection_tokens: int = 0
    env_steps: int = 0

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


class RolloutEngine:
    """Runs batches of episodes in lock-step with a policy and an optional frozen reflection model."""

    def __init__(
        self,
        env_name: str,
        policy: Actor,
        reflection: ReflectionPlayer | None = None,
        env_kwargs: dict[str, Any] | None = None,
        shuffle_options: bool = False,
        max_prompt_length: int | None = None,
        record_state_keys: bool = False,
        record_optimal_actions: bool = False,
        teacher: Reflector | None = None,
    ) -> None:
        self.env_name = env_name
        #: writes the oracle's reflection of every visited state (``Turn.teacher_reflection``), e.g. the environment's
        #: oracle reflector for on-policy supervision of the reflection player
        self.teacher = teacher
        self.env_kwargs = dict(env_kwargs or {})
        self.policy = policy
        self.reflection = reflection
        self.shuffle_options = shuffle_options
        self.max_prompt_length = max_prompt_length
        self.record_state_keys = record_state_keys
        self.record_optimal_actions = record_optimal_actions
        self.tokenizer = policy.tokenizer
        self._envs: list[TextEnv] = []
        self._concat_ok: bool | None = None
        # The reflection prompt's ids can be reused only when both players share one vocabulary.
        self._shared_vocab = (
            reflection is not None
            and self.tokenizer is not None
            and reflection.tokenizer is not None  # a served player may have no local tokenizer
            and (
                reflection.tokenizer is self.tokenizer
                or reflection.tokenizer.get_vocab() == self.tokenizer.get_vocab()
            )
        )
        self.timings = RolloutTimings()
        self.truncated_prompts = 0

    @property
    def labels(self) -> tuple[str, ...]:
        """The option labels shown in the prompts: always the ones the policy's head scores."""
        return self.policy.labels

    def _env(self, i: int) -> TextEnv:
        while len(self._envs) <= i:
            self._envs.append(make_env(self.env_name, **self.env_kwargs))
        return self._envs[i]

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        """Whole prompts, tokenized as SFT tokenized them (special tokens included)."""
        return encode_prompts(self.tokenizer, texts)

    def _tokenize_suffixes(self, texts: list[str]) -> list[list[int]]:
        """Continuations of an already tokenized head: no special tokens."""
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []

    def _policy_ids(
        self, heads: list[list[int]] | None, suffixes: list[str], full: list[str]
    ) -> list[list[int]]:
        """Token ids of the policy prompts, reusing the reflection prompt's ids when that is exact."""
        if self.tokenizer is None:  # an actor that reads no token ids
            return [[] for _ in full]
        if heads is None or not full:
            ids = self._tokenize(full)
        else:
            # A head left-truncated by the reflection model's max_prompt_length is not a prefix of the prompt.
            limit = self.reflection.max_prompt_length if self.reflection is not None else None
            whole = [not limit or len(h) < limit for h in heads]
            first = next((k for k, ok in enumerate(whole) if ok), None)
            if self._concat_ok is None and first is not None:
                # check once that piecewise tokenisation equals whole-text tokenisation
                pieces = heads[first] + self._tokenize_suffixes([suffixes[first]])[0]
                self._concat_ok = pieces == self._tokenize([full[first]])[0]
            if self._concat_ok:
                ids = [
                    h + s if ok else self._tokenize([f])[0]
                    for h, s, f, ok in zip(heads, self._tokenize_suffixes(suffixes), full, whole, strict=True)
                ]
            else:
                ids = self._tokenize(full)
        if self.max_prompt_length:
            for i, x in enumerate(ids):
                if len(x) > self.max_prompt_length:
                    ids[i] = x[-self.max_prompt_length :]
                    self.truncated_prompts += 1
        return ids

    def run(
        self,
        tasks: Sequence[Task],
        seeds: Sequence[int] | None = None,
        groups: Sequence[int] | None = None,
    ) -> list[Episode]:
        """Play one episode per task (lock-step) and return them in input order."""
        seeds = list(seeds) if seeds is not None else [t.seed for t in tasks]
        groups = list(groups) if groups is not None else list(range(len(tasks)))
        episodes = [Episode(task=t, seed=s, group=g) for t, s, g in zip(tasks, seeds, groups, strict=True)]
        observations = {}
        for i, (task, seed) in enumerate(zip(tasks, seeds, strict=True)):
            observations[i] = self._env(i).reset(seed=seed, task=task)
        live = list(range(len(tasks)))
        teacher_previous: dict[
            int, tuple[Observation, int]
        ] = {}  # the teacher's view of each episode's last turn
        step = 0
        while live:
            texts = [observations[i].text for i in live]
            # 1. reflections (one batched generate)
            reflections: list[str | None] = [None] * len(live)
            heads = None
            if self.reflection is not None:
                t0 = time.perf_counter()
                batch = self.reflection.generate([reflection_prompt(x) for x in texts])
                self.timings.reflection_s += time.perf_counter() - t0
                self.timings.reflection_tokens += sum(batch.num_tokens)
                reflections = list(batch.texts)
                heads = batch.prompt_ids if self._shared_vocab else None
            # 2. policy prompts
            t0 = time.perf_counter()
            prompts, suffixes = [], []
            for k, i in enumerate(live):
                obs = observations[i]
                shuffle_seed = derive_seed(episodes[i].seed, step) if self.shuffle_options else None
                prompt = build_prompt(
                    obs.text, obs.actions, reflections[k], labels=self.labels, shuffle_seed=shuffle_seed
                )
                prompts.append(prompt)
                if reflections[k] is not None:
                    suffixes.append(
                        with_stop(reflections[k])
                        + "\n"
                        + options_block(obs.actions, prompt.labels, prompt.order)
                    )
            ids = self._policy_ids(heads, suffixes, [p.text for p in prompts])
            self.timings.tokenize_s += time.perf_counter() - t0
            # 3. one forward of the policy
            t0 = time.perf_counter()
            views = [
                LiveEpisode(self._env(i), episodes[i], prompts[k], reflections[k]) for k, i in enumerate(live)
            ]
            options, logps, entropies, values = self.policy.act(
                ids, [p.num_options for p in prompts], live=views
            )
            self.timings.policy_s += time.perf_counter() - t0
            # 4. step the environments
            t0 = time.perf_counter()
            head = getattr(self.policy, "option_head", None)
            label_ids = head.label_ids.tolist() if head is not None else None
            still_live = []
            for k, i in enumerate(live):
                obs, prompt = observations[i], prompts[k]
                action_index = prompt.action_index(options[k])
                turn = Turn(
                    step=step,
                    state_text=obs.text,
                    actions=obs.actions,
                    reflection=reflections[k],
                    prompt_ids=ids[k],
                    num_options=prompt.num_options,
                    option=options[k],
                    action_index=action_index,
                    logprob=logps[k],
                    entropy=entropies[k],
                    value=None if values is None else values[k],
                    label_token=label_ids[options[k]] if label_ids is not None else -1,
                )
                if self.reflection is not None:
                    turn.reflection_tokens = batch.num_tokens[k]
                    turn.reflection_stopped = batch.stopped[k]
                    if batch.token_ids is not None:  # a reflection player that is trained
                        turn.reflection_prompt_ids = tuple(batch.prompt_ids[k])
                        turn.reflection_ids = tuple(batch.token_ids[k])
                        turn.reflection_logps = tuple(batch.token_logps[k])
                if self.record_state_keys:
                    turn.state_key = self._env(i).state_key()
                if self.record_optimal_actions:
                    turn.optimal_actions = optimal_actions(self._env(i))
                if self.teacher is not None:
                    turn.teacher_reflection, oracle = self._teacher_reflection(
                        self._env(i), episodes[i], obs, teacher_previous.get(i), step
                    )
                    teacher_previous[i] = (obs, oracle)
                next_obs, reward, terminated, truncated, info = self._env(i).step(action_index)
                turn.reward = float(reward)
                episodes[i].turns.append(turn)
                self.timings.env_steps += 1
                if terminated or truncated:
                    ep = episodes[i]
                    ep.success = bool(info.get("success", False))
                    ep.crashed = bool(info.get("crash", False))
                    ep.truncated = bool(truncated and not terminated)
                    ep.info = {k2: v for k2, v in info.items() if isinstance(v, (bool, int, float, str))}
                else:
                    observations[i] = next_obs
                    still_live.append(i)
            self.timings.env_s += time.perf_counter() - t0
            live = still_live
            step += 1
        return episodes

    def _teacher_reflection(
        self,
        env: TextEnv,
        episode: Episode,
        obs: Observation,
        previous: tuple[Observation, int] | None,
        step: int,
    ) -> tuple[str, int]:
        """The teacher's reflection of the episode's current state (``env`` before the action) with what the data
        builder gives the oracle reflector: the previous state and the last action, whether it was the oracle's
        (``previous``: the previous observation and its oracle action) and its reward. Returns the text and this
        state's oracle action."""
        oracle = env.oracle_action()
        last = episode.turns[-1] if episode.turns else None
        ctx = ReflectionContext(
            env=env,
            observation=obs,
            step=step,
            oracle_action=oracle,
            previous_observation=previous[0] if last is not None and previous else None,
            last_action=last.action_text if last is not None else None,
            last_action_was_oracle=(last.action_index == previous[1])
            if last is not None and previous
            else None,
            last_reward=last.reward if last is not None else None,
        )
        return self.teacher.reflect(ctx, random.Random(derive_seed(episode.seed, step, "teacher"))), oracle


def optimal_actions(env: TextEnv) -> tuple[int, ...] | None:
    """``env.optimal_actions()`` sorted, or None where the environment has no oracle for the state."""
    try:
        return tuple(sorted(env.optimal_actions()))
    except (NotImplementedError, RuntimeError):
        return None


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Success rate, return, length, crash rate and reflection statistics of a batch of episodes."""
    n = max(len(episodes), 1)
    turns = [t for ep in episodes for t in ep.turns]
    out = {
        "success_rate": sum(ep.success for ep in episodes) / n,
        "return": sum(ep.total_return for ep in episodes) / n,
        "episode_length": sum(ep.length for ep in episodes) / n,
        "crash_rate": sum(ep.crashed for ep in episodes) / n,
    }
    reflected = [t for t in turns if t.reflection is not None]
    if reflected:
        out["reflection_tokens"] = sum(t.reflection_tokens for t in reflected) / len(reflected)
        out["reflection_stop_rate"] = sum(t.reflection_stopped for t in reflected) / len(reflected)
    if turns:
        out["policy_entropy"] = sum(t.entropy for t in turns) / len(turns)
    return out
