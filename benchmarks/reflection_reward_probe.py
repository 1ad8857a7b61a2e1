"""Does the verified reflection reward, applied as ``ReflectPPOTrainer`` applies it, make a reflection model name
optimal moves more often on states it was not trained on?

A probe without the policy and without episodes: fixed DangerousTaxi states (the oracle's trajectories, 0-3 steps
in, `pickup` and `full`), ``--samples`` reflections per state at T = 1, the verified reward and its same-state
group-relative advantage (``rl_math`` section 4), the reflection's clipped token surrogate
(:meth:`ReflectionLearner.losses`), AdamW at ``--lr``. The optimal-naming rate is measured greedily and sampled
(4 per state) on `validation` states before and after (and greedily every 10 updates); it also reports how often a
sample is right at the training states the greedy reflection gets wrong (where a same-state group can learn)::

    python benchmarks/reflection_reward_probe.py outputs/demo/runs/sft_reflection --lr 3e-4 --updates 60
"""

from __future__ import annotations

import argparse
import random

import torch
from torch import nn

from reflect_trl import rl_math
from reflect_trl.envs import make_env
from reflect_trl.models import load_causal_lm, load_tokenizer
from reflect_trl.prompts import recommended_action, reflection_prompt
from reflect_trl.reflection.player import make_reflection_player
from reflect_trl.trainers import rl_batch
from reflect_trl.trainers.reflection_learner import ReflectionLearner


def fixed_states(split: str, per_stage: int, seed: int) -> list[tuple]:
    """(observation, optimal actions) of oracle trajectories 0-3 steps into `pickup` and `full` tasks of ``split``."""
    rng, out = random.Random(seed), []
    env = make_env("taxi")
    for stage in ("pickup", "full"):
        for task in env.make_tasks(split, per_stage, seed=seed, difficulty=stage):
            walker = make_env("taxi")
            obs = walker.reset(task=task)
            for _ in range(rng.randrange(0, 4)):
                if walker.done:
                    break
                obs, *_ = walker.step(walker.oracle_action())
            if not walker.done:
                out.append((obs, frozenset(walker.optimal_actions())))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "reflection_model", help="an SFT'd reflection model (e.g. <demo>/runs/sft_reflection)"
    )
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--updates", type=int, default=60)
    parser.add_argument("--states_per_update", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4, help="reflections per state (the same-state group)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    tokenizer = load_tokenizer(args.reflection_model)
    model = load_causal_lm(args.reflection_model, trainable=True)
    learner = ReflectionLearner(nn.Module(), model, tokenizer)
    held_out, train = fixed_states("validation", 40, 1), fixed_states("train", 200, 2)

    def player(temperature: float):
        return make_reflection_player(
            "hf",
            model=model,
            tokenizer=tokenizer,
            max_new_tokens=48,
            temperature=temperature,
            freeze=False,
            record_tokens=temperature > 0,
        )

    def naming_rate(states: list[tuple], temperature: float, k: int = 1) -> float:
        model.eval()
        repeated = [s for s in states for _ in range(k)]
        texts = player(temperature).generate([reflection_prompt(o.text) for o, _ in repeated]).texts
        right = sum(
            recommended_action(x, o.actions) in best for x, (o, best) in zip(texts, repeated, strict=True)
        )
        return right / len(texts)

    print(
        f"before: greedy {naming_rate(held_out, 0.0):.3f} sampled {naming_rate(held_out, 1.0, 4):.3f}",
        flush=True,
    )
    # where can a same-state group learn? at the states the greedy reflection gets wrong, how often a sample is right
    model.eval()
    greedy = player(0.0).generate([reflection_prompt(o.text) for o, _ in train]).texts
    wrong = [s for s, x in zip(train, greedy, strict=True) if recommended_action(x, s[0].actions) not in s[1]]
    if wrong:
        print(
            f"training states the greedy reflection gets wrong: {len(wrong)} of {len(train)}; share of 8 samples "
            f"there that name an optimal move: {naming_rate(wrong, 1.0, 8):.3f}",
            flush=True,
        )
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0
    )
    k = args.samples
    for update in range(args.updates):
        states = random.sample(train, args.states_per_update)
        repeated = [s for s in states for _ in range(k)]
        model.eval()
        batch = player(1.0).generate([reflection_prompt(o.text) for o, _ in repeated])
        named = [recommended_action(x, o.actions) for x, (o, _) in zip(batch.texts, repeated, strict=True)]
        rewards = rl_math.verified_reflection_rewards(
            named, [best for _, best in repeated], no_move_penalty=0.5
        )
        advantages, _ = rl_math.state_group_advantages(
            rewards, [0] * len(rewards), [i // k for i in range(len(rewards))], "group", 0.1
        )
        rows = [
            rl_batch.TurnRow(
                prompt_ids=[0],
                option=0,
                num_options=1,
                advantage=a,
                reflection_prompt_ids=batch.prompt_ids[i],
                reflection_ids=batch.token_ids[i],
                reflection_logps=batch.token_logps[i],
            )
            for i, a in enumerate(advantages)
        ]
        model.train()
        terms, _ = learner.losses(rl_batch.collate(rows, tokenizer.pad_token_id, "cpu"), 1.0, 0.2, 0.2, 0.0)
        optimizer.zero_grad()
        terms.policy.mean().backward()
        optimizer.step()
        if update % 10 == 9:
            print(
                f"update {update + 1}: verified reward of the batch {sum(rewards) / len(rewards):.3f}; held-out greedy "
                f"{naming_rate(held_out, 0.0):.3f}",
                flush=True,
            )
    print(
        f"after: greedy {naming_rate(held_out, 0.0):.3f} sampled {naming_rate(held_out, 1.0, 4):.3f}",
        flush=True,
    )
    if wrong:
        print(
            f"after, greedy at those {len(wrong)} training states: {naming_rate(wrong, 0.0):.3f} (0 before)",
            flush=True,
        )


if __name__ == "__main__":
    main()
