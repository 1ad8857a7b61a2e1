"""A tiny reflection model that has learnt to write reflections and stop: a nano Llama trained for a few seconds
on DangerousTaxi states and their oracle reflections (each target ends with the stop marker).

A freshly built tiny model almost never writes the stop marker; this one stops at varied lengths, so stop
handling is exercised through real generation.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from reflect_trl.envs import make_env
from reflect_trl.prompts import encode_prompts, reflection_prompt, with_stop
from reflect_trl.reflection import ReflectionContext, get_oracle_reflector
from reflect_trl.tiny_models import build_tiny_model


def reflection_pairs(n_tasks: int = 8, steps: int = 3, seed: int = 0) -> list[tuple[str, str]]:
    """(reflection prompt, target = oracle reflection + stop marker) for the first ``steps`` oracle steps of
    ``n_tasks`` DangerousTaxi tasks."""
    env, reflector, rng = make_env("taxi"), get_oracle_reflector("taxi"), random.Random(seed)
    pairs = []
    for task in env.make_tasks("train", n_tasks, seed=seed):
        obs, previous, last = env.reset(task=task), None, None
        for step in range(steps):
            oracle = env.oracle_action()
            ctx = ReflectionContext(env, obs, step, oracle, previous, last, True)
            pairs.append((reflection_prompt(obs.text), with_stop(reflector.reflect(ctx, rng))))
            previous, last = obs, obs.actions[oracle]
            obs, _, terminated, truncated, _ = env.step(oracle)
            if terminated or truncated:
                break
    return pairs


def train_tiny_reflector(
    output_dir: str | Path, pairs: list[tuple[str, str]], steps: int = 80, lr: float = 1e-2, seed: int = 0
) -> Path:
    """Build a nano Llama in ``output_dir``, fit it on ``pairs`` (loss on the targets only), save it there."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = build_tiny_model(output_dir, arch="llama", preset="nano", seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    prompts = encode_prompts(tokenizer, [p for p, _ in pairs])
    targets = [tokenizer(t, add_special_tokens=False)["input_ids"] for _, t in pairs]
    width = max(len(p) + len(t) for p, t in zip(prompts, targets, strict=True))
    ids = torch.full((len(pairs), width), tokenizer.pad_token_id)
    labels = torch.full((len(pairs), width), -100)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for i, (p, t) in enumerate(zip(prompts, targets, strict=True)):
        ids[i, : len(p) + len(t)] = torch.tensor(p + t)
        labels[i, len(p) : len(p) + len(t)] = torch.tensor(t)
        mask[i, : len(p) + len(t)] = 1
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    model.save_pretrained(out)
    return out
