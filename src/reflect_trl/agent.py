"""A trained Reflect-RL pair in one object: ``ReflectAgent.from_pretrained(policy, reflection=...)``.

``agent.act(observation)`` returns the index of the action the policy picks (pass it to ``env.step``);
``agent.decide(observation)`` also returns the reflection and the probability of every offered option;
``agent.play(env, task)`` plays one episode and returns its transcript (the format of ``reflect-trl eval``'s
transcripts)::

    from reflect_trl.agent import ReflectAgent
    from reflect_trl.envs import make_env

    agent = ReflectAgent.from_pretrained("outputs/rl", reflection="outputs/sft_reflection")
    env = make_env("taxi")
    episode = agent.play(env, env.make_tasks("test", 1, seed=0)[0])
    print(episode["success"], [turn["action"] for turn in episode["turns"]])

The prompts are the ones of training (:func:`reflect_trl.prompts.build_prompt`, the option labels recorded with the
policy), the policy is scored over the offered options only (:class:`reflect_trl.action_head.OptionHead`), and the
reflection model writes its reflection first (greedy by default). Batched play of many episodes in lock-step is what
``reflect_trl.rollout.RolloutEngine`` does for RL and ``reflect-trl eval``; this class is the one-observation
interface for using a trained pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reflect_trl.envs import Observation, Task, TextEnv, make_env
from reflect_trl.prompts import build_prompt, encode_prompts, reflection_prompt, resolve_option_labels


@dataclass(frozen=True)
class Decision:
    """What the agent chose in one state: the action (index and text), the reflection it read (None without a
    reflection model) and the probability of every offered action, in the environment's order."""

    action_index: int
    action: str
    reflection: str | None
    probabilities: tuple[float, ...]
    reflection_stopped: bool = True


class ReflectAgent:
    """A policy (and optionally its frozen reflection model) that acts on :class:`~reflect_trl.envs.Observation`\\ s.

    ``greedy`` picks the most probable option; otherwise options are sampled at ``temperature`` (seeded by
    ``seed``). A policy trained with reflections in its prompts needs its reflection model (``reflection``)."""

    def __init__(
        self,
        policy,
        tokenizer,
        labels: tuple[str, ...],
        reflection=None,
        *,
        greedy: bool = True,
        temperature: float = 1.0,
        max_prompt_length: int | None = None,
        seed: int = 0,
    ) -> None:
        import torch

        from reflect_trl.action_head import OptionHead

        self.policy = policy.eval()
        self.tokenizer = tokenizer
        self.labels = tuple(labels)
        self.head = OptionHead(tokenizer, self.labels)
        self.reflection = reflection
        self.greedy = greedy
        self.temperature = temperature
        self.max_prompt_length = max_prompt_length
        self.generator = torch.Generator().manual_seed(seed)

    @classmethod
    def from_pretrained(
        cls,
        policy: str,
        reflection: str | None = None,
        *,
        device: str | None = None,
        dtype: str = "auto",
        option_labels: str | list[str] | None = None,
        reflection_max_new_tokens: int = 64,
        reflection_temperature: float = 0.0,
        **kwargs: Any,
    ) -> ReflectAgent:
        """Load a policy (an ``output_dir`` of ``reflect-trl sft``/``rl``, or a hub id) and its reflection model.

        The option labels are the ones recorded with the policy (``option_labels`` only to override them for a hub
        model that recorded none); ``device`` defaults to CUDA when available; ``kwargs`` go to the constructor
        (``greedy``, ``temperature``, ``max_prompt_length``, ``seed``)."""
        import torch

        from reflect_trl.models import load_causal_lm, load_tokenizer
        from reflect_trl.reflection.player import make_reflection_player

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        tokenizer = load_tokenizer(policy)
        model = load_causal_lm(policy, dtype=dtype, trainable=False, merge_adapter=True).to(device)
        labels = resolve_option_labels(
            option_labels, policy if Path(policy).is_dir() else None, f"the policy {policy!r}"
        )
        player = None
        if reflection and reflection.lower() != "none":
            player = make_reflection_player(
                "hf",
                model=load_causal_lm(reflection, dtype=dtype, trainable=False, merge_adapter=True).to(device),
                tokenizer=load_tokenizer(reflection),
                max_new_tokens=reflection_max_new_tokens,
                temperature=reflection_temperature,
            )
        return cls(model, tokenizer, labels, player, **kwargs)

    # -- one state ---------------------------------------------------------------------------------------------
    def reflect(self, observation: Observation) -> tuple[str | None, bool]:
        """The reflection model's reflection on ``observation`` (None without one) and whether it ended with its stop
        marker within the budget."""
        if self.reflection is None:
            return None, True
        batch = self.reflection.generate([reflection_prompt(observation.text)])
        return batch.texts[0], bool(batch.stopped[0])

    def decide(self, observation: Observation) -> Decision:
        """Reflect (with a reflection model), then score the offered options with the policy and choose one."""
        import torch

        reflection, stopped = self.reflect(observation)
        prompt = build_prompt(observation.text, observation.actions, reflection, labels=self.labels)
        ids = encode_prompts(self.tokenizer, [prompt.text])[0]
        if self.max_prompt_length:
            ids = ids[-self.max_prompt_length :]
        with torch.no_grad():
            log_probs = self.head.forward(
                self.policy,
                [ids],
                [prompt.num_options],
                temperature=1.0 if self.greedy else self.temperature,
            ).log_probs[0]
        option = int(
            self.head.select(log_probs.unsqueeze(0), greedy=self.greedy, generator=self.generator)[0].item()
        )
        by_option = log_probs[: prompt.num_options].exp().tolist()
        probabilities = [0.0] * len(observation.actions)
        for position, p in enumerate(by_option):
            probabilities[prompt.action_index(position)] = float(p)
        index = prompt.action_index(option)
        return Decision(index, observation.actions[index], reflection, tuple(probabilities), stopped)

    def act(self, observation: Observation) -> int:
        """The index of the chosen action among ``observation.actions`` (what ``env.step`` takes)."""
        return self.decide(observation).action_index

    # -- one episode -------------------------------------------------------------------------------------------
    def play(
        self,
        env: TextEnv | str,
        task: Task | None = None,
        seed: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Play one episode of ``task`` (default: the first ``test`` task of ``env`` for ``seed`` 0) and return its
        transcript: task, seed, success, crashed, truncated, return, length and the turns (state, reflection,
        options, action, its probability, reward)."""
        if isinstance(env, str):
            env = make_env(env, **(env_kwargs or {}))
        if task is None:
            task = env.make_tasks("test", 1, seed=seed or 0)[0]
        seed = task.seed if seed is None else seed
        observation = env.reset(seed=seed, task=task)
        turns: list[dict[str, Any]] = []
        info: dict[str, Any] = {}
        terminated = truncated = False
        while not (terminated or truncated):
            decision = self.decide(observation)
            next_observation, reward, terminated, truncated, info = env.step(decision.action_index)
            turns.append(
                {
                    "step": len(turns),
                    "state": observation.text,
                    "reflection": decision.reflection,
                    "options": list(observation.actions),
                    "action": decision.action,
                    "action_index": decision.action_index,
                    "probability": decision.probabilities[decision.action_index],
                    "reward": float(reward),
                }
            )
            observation = next_observation
        return {
            "task": task.to_dict(),
            "seed": seed,
            "success": bool(info.get("success", False)),
            "crashed": bool(info.get("crash", False)),
            "truncated": bool(truncated and not terminated),
            "return": sum(t["reward"] for t in turns),
            "length": len(turns),
            "turns": turns,
        }


__all__ = ["Decision", "ReflectAgent"]
