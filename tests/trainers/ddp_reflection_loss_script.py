"""Under `accelerate launch` (2 processes): one hand-built micro-batch with reflections per rank through
ReflectPPOTrainer's loss and backward, then a comparison of the reflection player's gradient with the hand-computed
gradient of the reflection objective's mean over the real turns of *both* ranks. Rank 1 holds padding rows only (a
process with fewer turns than another). Writes ``rank{r}.json`` into the output directory.

Usage: ddp_reflection_loss_script.py MODEL_DIR OUTPUT_DIR TRAIN_POLICY(true|false)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

# the script's own folder (tests/trainers) is on sys.path when it runs
from test_rl_loss import hand_batch, make_trainer
from test_rl_reflection import _hand_token_logps

from reflect_trl import rl_math
from reflect_trl.cli.rl import shutdown_distributed
from reflect_trl.models import load_causal_lm, load_tokenizer
from reflect_trl.prompts import encode_prompts, reflection_prompt
from reflect_trl.trainers.rl_batch import collate_reflections

ROWS, REAL = 6, (5, 0)  # rows per rank, real rows of rank 0 and rank 1


def reflection_rows(tokenizer, vocab: int) -> list[SimpleNamespace]:
    """Both ranks' turns (rank 0's first): a reflection prompt, 1-4 generated tokens and old log-probs spread around
    an untrained model's (so that ratios leave the clip range on both sides)."""
    g = torch.Generator().manual_seed(3)
    rows = []
    for rank in range(2):
        for i in range(ROWS):
            prompt = encode_prompts(tokenizer, [reflection_prompt(f"Taxi at row {i}, col {rank}.")])[0]
            n = int(torch.randint(1, 5, (), generator=g))
            ids = torch.randint(0, vocab, (n,), generator=g).tolist()
            old = (torch.log(torch.tensor(1.0 / vocab)) + 0.8 * torch.randn(n, generator=g)).tolist()
            rows.append(SimpleNamespace(reflection_prompt_ids=prompt, reflection_ids=ids, reflection_logps=old,
                                        real=i < REAL[rank]))  # fmt: skip
    return rows


if __name__ == "__main__":
    model_dir, out_dir, train_policy = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "true"
    trainer = make_trainer(
        model_dir,
        out_dir,
        trainer_kwargs=dict(
            reflection_model=load_causal_lm(model_dir), reflection_tokenizer=load_tokenizer(model_dir)
        ),
        train_reflection=True,
        train_policy=train_policy,
        reflection_temperature=1.0,
        reflection_beta=0.0,
        advantage_estimator="rloo",
    )
    accelerator, learner = trainer.accelerator, trainer.reflection_learner
    rank, world = accelerator.process_index, accelerator.num_processes
    assert world == 2 and torch.distributed.is_initialized(), (world, torch.distributed.is_initialized())
    tok = trainer._tokenizer
    reflections = collate_reflections(
        reflection_rows(tok, learner.model.config.vocab_size), tok.pad_token_id, "cpu"
    )
    batches = []
    for r in range(2):
        batch = hand_batch(tok, ROWS, REAL[r], seed=10 + r)
        batch.update({k: v[r * ROWS : (r + 1) * ROWS] for k, v in reflections.items()})
        batches.append(batch)
    mine = batches[rank]
    model = accelerator.prepare_model(trainer.model)
    model.train()
    trainer._generate_and_score_completions = lambda inputs: dict(mine)
    trainer._buffered_inputs, trainer._step = None, 0
    mine = trainer._prepare_inputs([{}] * ROWS)
    loss = trainer.compute_loss(model, mine)
    accelerator.backward(loss)  # DDP (both players) or the learner itself (train_policy false) averages
    params = learner.parameters()
    grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params]

    # By hand, on this process alone: the mean over the real turns of both ranks of the turn's token objective.
    merged = {
        k: torch.cat([b[k] for b in batches]) for k in batches[0] if k in reflections or k == "advantages"
    }
    merged["turn_mask"] = torch.cat([b["turn_mask"] for b in batches])
    logp = _hand_token_logps(learner.model, merged)
    terms = rl_math.reflection_token_losses(
        logp,
        merged["old_reflection_logps"],
        merged["reflection_token_mask"],
        merged["advantages"],
        clip_low=trainer.epsilon_low,
        clip_high=trainer.epsilon_high,
    )
    real = merged["turn_mask"]
    objective = (terms.policy * real).sum() / real.sum()
    want = torch.autograd.grad(objective, params, allow_unused=True)
    diff = max(
        float((g - (w if w is not None else torch.zeros_like(g))).abs().max())
        for g, w in zip(grads, want, strict=True)
    )
    record = {
        "rank": rank,
        "world_size": world,
        "window_turns": int(mine["window_turns"].item()),
        "clipped": float((terms.clipped * real).sum()),
        "max_grad_diff": diff,
        "grad_norm": float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads))),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(record) + "\n")
    shutdown_distributed()
