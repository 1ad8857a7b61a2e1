"""The reflection player as a second learner (``ReflectPPOConfig.train_reflection``, beyond the paper).

In the paper the reflection model is frozen. Here it can learn online from the same turn-level advantages as the
policy: the reflection a policy read at turn t is trained with A_t (``rl_math`` section 4: a token-level clipped
surrogate over its generated tokens, normalised per turn, plus a k3 KL to the SFT'd reflection model).

How it rides on GRPOTrainer's machinery: the reflection model becomes a submodule of the policy
(``reflect_reflection``), so the optimizer (its own learning rate, :meth:`ReflectionLearner.split_param_groups`),
DDP's gradient averaging, gradient clipping and the optimizer's checkpointed state cover both players with nothing
home-made. It is detached from the policy whenever the policy is saved (the policy's weights never contain it) and
saved on its own: ``<output_dir>/reflection`` (a full model, its LoRA merged) and, in checkpoints,
``reflection_state.pt`` (its trainable tensors, for an exact resume). Its reference is a frozen copy of the starting
weights, or the same model with its LoRA adapter disabled.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from reflect_trl import rl_math
from reflect_trl.batching import position_ids_from_mask

SUBMODULE = "reflect_reflection"
STATE_FILE = "reflection_state.pt"
OUTPUT_DIR = "reflection"


class ReflectionLearner:
    """Trains the reflection player with the policy's turn advantages."""

    def __init__(self, policy: nn.Module, model: nn.Module, tokenizer, peft_config=None) -> None:
        from trl.trainer.utils import disable_dropout_in_model

        if peft_config is not None:
            from peft import get_peft_model

            model = get_peft_model(model, copy.deepcopy(peft_config))
            self.reference = None  # the adapter disabled
        else:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
            for p in model.parameters():
                p.requires_grad_(True)
        disable_dropout_in_model(model)
        self.model = model
        self.tokenizer = tokenizer
        self.policy = policy
        policy.add_module(SUBMODULE, model)

    # -------------------------------------------------------------------------------------------- optimizer
    def parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def split_param_groups(self, optimizer: torch.optim.Optimizer, learning_rate: float) -> None:
        """Move the reflection's parameters out of the optimizer's groups into groups of their own (same weight
        decay) at ``learning_rate``; schedulers built afterwards scale every group's rate alike."""
        mine = {id(p) for p in self.parameters()}
        extra = []
        for group in optimizer.param_groups:
            moved = [p for p in group["params"] if id(p) in mine]
            if moved:
                group["params"] = [p for p in group["params"] if id(p) not in mine]
                extra.append({**{k: v for k, v in group.items() if k != "params"}, "params": moved})
        for group in extra:
            group["lr"] = group["initial_lr"] = learning_rate
            optimizer.add_param_group(group)
        optimizer.param_groups[:] = [g for g in optimizer.param_groups if g["params"]]

    # ------------------------------------------------------------------------------------------------ scoring
    def token_logps(
        self, model: nn.Module, batch: dict[str, Any], temperature: float, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log phi(y_j | x, y_<j) of every column of ``reflection_ids`` (0 where there is no generated token), from one
        forward that keeps the logits of the generated span only (left padding puts it in the last columns)."""
        ids, mask, tokens = batch["reflection_ids"], batch["reflection_mask"], batch["reflection_token_mask"]
        span = int(tokens.sum(-1).max().item()) if tokens.numel() else 0
        out = torch.zeros(ids.shape, device=ids.device)
        if span == 0:
            return out, (torch.zeros(ids.shape, device=ids.device) if with_entropy else None)
        logits = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=position_ids_from_mask(mask),
            logits_to_keep=span + 1,
            use_cache=False,
        ).logits[:, :-1, :]  # position j predicts token j + 1: the last span columns
        log_probs = (logits.float() / temperature).log_softmax(-1)
        target = ids[:, -span:]
        out = torch.cat([out[:, :-span], log_probs.gather(-1, target[..., None]).squeeze(-1)], dim=1)
        entropy = None
        if with_entropy:
            ent = -(log_probs.exp() * log_probs).sum(-1).detach()
            entropy = torch.cat([torch.zeros_like(out[:, :-span]), ent], dim=1)
        return out * tokens, entropy

    @torch.no_grad()
    def reference_logps(self, batch: dict[str, Any], temperature: float) -> torch.Tensor:
        """The reference's token log-probs: the starting weights (frozen copy, or the adapter disabled)."""
        if self.reference is not None:
            return self.token_logps(self.reference, batch, temperature)[0]
        with self.model.disable_adapter():
            return self.token_logps(self.model, batch, temperature)[0]

    def losses(
        self, inputs: dict[str, Any], temperature: float, clip_low: float, clip_high: float, beta: float
    ):
        """The per-turn terms of ``rl_math.reflection_token_losses`` and the token entropy per turn."""
        logp, entropy = self.token_logps(self.model, inputs, temperature, with_entropy=True)
        terms = rl_math.reflection_token_losses(
            logp,
            inputs["old_reflection_logps"],
            inputs["reflection_token_mask"],
            inputs["advantages"],
            clip_low=clip_low,
            clip_high=clip_high,
            ref_logp=inputs.get("ref_reflection_logps") if beta != 0.0 else None,
        )
        tokens = inputs["reflection_token_mask"]
        turn_entropy = (entropy * tokens).sum(-1) / tokens.sum(-1).clamp(min=1.0)
        return terms, turn_entropy

    # ------------------------------------------------------------------------------------------------ saving
    @contextlib.contextmanager
    def detached(self, policy: nn.Module) -> Iterator[None]:
        """The policy without its reflection submodule (while the policy is saved)."""
        module = policy._modules.pop(SUBMODULE, None)
        try:
            yield
        finally:
            if module is not None:
                policy._modules[SUBMODULE] = module

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.model.named_parameters() if v.requires_grad}

    def save_state(self, checkpoint: Path) -> None:
        torch.save(self.trainable_state(), checkpoint / STATE_FILE)

    def load_state(self, checkpoint: Path) -> None:
        path = checkpoint / STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: {checkpoint} was not written with train_reflection")
        state = torch.load(path, weights_only=True)
        missing = set(state) - {k for k, _ in self.model.named_parameters()}
        if missing:
            raise ValueError(f"{path}: parameters {sorted(missing)[:3]} are not the reflection model's")
        with torch.no_grad():
            params = dict(self.model.named_parameters())
            for k, v in state.items():
                params[k].copy_(v.to(params[k].device))

    def save_model(self, output_dir: Path) -> Path:
        """The trained reflection player as a full model (its LoRA merged) with its tokenizer, in
        ``<output_dir>/reflection``: load it like any reflection model."""
        out = output_dir / OUTPUT_DIR
        model = self.model
        if hasattr(model, "merge_and_unload"):
            model = copy.deepcopy(model).merge_and_unload()
        model.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        return out


__all__ = ["OUTPUT_DIR", "STATE_FILE", "SUBMODULE", "ReflectionLearner"]
