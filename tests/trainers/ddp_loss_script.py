"""Under `accelerate launch` (2 processes): one hand-built micro-batch per rank through ReflectPPOTrainer's loss,
backward through the DDP-wrapped policy, and a comparison with the hand-computed gradient of the mean objective over
the real turns of *both* ranks. Writes ``rank{r}.json`` into the output directory.

Usage: ddp_loss_script.py MODEL_DIR OUTPUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

# the script's own folder (tests/trainers) is on sys.path when it runs: the hand computations of test_rl_loss
from test_rl_loss import hand_batch, hand_logps, hand_objective, make_trainer

from reflect_trl.cli.rl import shutdown_distributed

if __name__ == "__main__":
    model_dir, out_dir = sys.argv[1], Path(sys.argv[2])
    trainer = make_trainer(model_dir, out_dir)
    accelerator = trainer.accelerator
    rank, world = accelerator.process_index, accelerator.num_processes
    assert world == 2 and torch.distributed.is_initialized(), (world, torch.distributed.is_initialized())
    # Different numbers of real turns per rank: 5 of 6 rows on rank 0, 1 of 6 on rank 1.
    batches = [hand_batch(trainer._tokenizer, 6, 5, seed=10), hand_batch(trainer._tokenizer, 6, 1, seed=11)]
    mine = batches[rank]
    model = accelerator.prepare_model(trainer.model)
    model.train()
    # through GRPOTrainer's buffering: _prepare_inputs writes the window's real turns over both ranks
    trainer._generate_and_score_completions = lambda inputs: dict(mine)
    trainer._buffered_inputs, trainer._step = None, 0
    mine = trainer._prepare_inputs([{}] * 6)
    loss = trainer.compute_loss(model, mine)
    accelerator.backward(loss)  # DDP averages the gradients over the 2 processes
    unwrapped = accelerator.unwrap_model(model)
    params = [p for p in unwrapped.parameters() if p.requires_grad]
    ddp_grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params]

    # By hand, on this process alone: the mean objective over the real turns of both ranks' batches.
    label_ids = trainer.option_head.label_ids
    logps = [hand_logps(unwrapped, label_ids, b) for b in batches]
    merged = {key: torch.cat([b[key] for b in batches]) for key in ("old_logps", "advantages", "turn_mask")}
    objective = hand_objective(torch.cat([lp for lp, _ in logps]), torch.cat([h for _, h in logps]), merged)
    want = torch.autograd.grad(objective, params, allow_unused=True)
    diff = max(
        float((g - (w if w is not None else torch.zeros_like(g))).abs().max())
        for g, w in zip(ddp_grads, want, strict=True)
    )
    record = {
        "rank": rank,
        "world_size": world,
        "window_turns": int(mine["window_turns"].item()),
        "max_grad_diff": diff,
        "grad_norm": float(torch.sqrt(sum((g.double() ** 2).sum() for g in ddp_grads))),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(record) + "\n")
    shutdown_distributed()
