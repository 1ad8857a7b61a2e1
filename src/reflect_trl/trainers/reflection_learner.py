"""The reflection player as a second learner (``ReflectPPOConfig.train_reflection``, beyond the paper).

In the paper the reflection model is frozen. Here it can learn online: the reflection a policy read at turn t is
trained with an advantage A^R_t (``rl_math`` section 4: a token-level clipped surrogate over its generated tokens,
normalised per turn, plus a k3 KL to the SFT'd reflection model) -- the policy's turn advantage, a verified reward of
its own (does it name an optimal move?), or a mix (``reflection_reward``). A control (``reflection_objective:
oracle_sft``) trains it by SFT towards the oracle reflector's text at the states the pair visits instead.

How it rides on GRPOTrainer's machinery: the reflection model becomes a submodule of the policy
(``reflect_reflection``), so the optimizer (its own learning rate, :meth:`ReflectionLearner.split_param_groups`),
DDP's gradient averaging, gradient clipping and the optimizer's checkpointed state cover both players with nothing
home-made. One exception: with ``train_policy: false`` no forward runs through the DDP-wrapped policy, so DDP's
gradient hooks stay idle; the learner then averages its gradients over the processes itself
(:meth:`ReflectionLearner.average_gradients`; DeepSpeed and FSDP are refused there). It is detached from the policy
whenever the policy is saved (the policy's weights never contain it) and saved on its own: ``<output_dir>/reflection``
(a full model, its LoRA merged) and, in checkpoints, ``reflection_state.pt`` (its trainable tensors, for an exact
resume). Its reference is a frozen copy of the starting weights, or the same model with its LoRA adapter disabled.
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
#: elements per all-reduce when the learner averages its own gradients (DDP's default bucket is 25 MiB)
BUCKET_ELEMENTS = 2**24
STATE_FILE = "reflection_state.pt"
OUTPUT_DIR = "reflection"


class ReflectionLearner:
    """Trains the reflection player (its advantages, or its oracle targets, come with the batch)."""

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
        self._accelerator = None  # set by average_gradients: the learner all-reduces its gradients itself

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

    # ------------------------------------------------------------------------------------------------ gradients
    def average_gradients(self, accelerator) -> None:
        """Average this player's gradients over the processes at the end of every backward that synchronises
        (the last micro-batch of an accumulation window), before clipping and the optimizer step.

        For ``train_policy: false``: no forward then runs through the DDP-wrapped policy, so DDP's reducer is never
        prepared and its gradient hooks do nothing -- each process would silently train its own reflection player.
        DeepSpeed and FSDP reduce (or shard) gradients inside their own engines, out of this reach: refused with
        more than one process. A no-op with one process."""
        if accelerator.num_processes <= 1:
            return
        kind = accelerator.distributed_type
        # accelerate wraps the model in DDP for every MULTI_* type
        if not str(getattr(kind, "value", kind)).startswith("MULTI_"):
            raise ValueError(
                f"train_policy=false with {accelerator.num_processes} processes is supported under DDP only (got "
                f"{getattr(kind, 'value', kind)}): launch with a DDP accelerate config "
                "(recipes/accelerate_configs/ddp.yaml), or set train_policy=true"
            )
        self._accelerator = accelerator

    def _queue_average(self, grad: torch.Tensor) -> None:
        """A hook on the log-probs: averages the gradients once this backward has accumulated them all."""
        torch.autograd.Variable._execution_engine.queue_callback(self._average_now)

    def _average_now(self) -> None:
        if not self._accelerator.sync_gradients:
            return  # a micro-batch inside an accumulation window: kept local, as under DDP's no_sync
        world = self._accelerator.num_processes
        params = self.parameters()
        for p in params:
            if p.grad is None:  # every process reduces the same tensors in the same order
                p.grad = torch.zeros_like(p)
        buckets: dict[tuple, list[list[torch.Tensor]]] = {}
        sizes: dict[tuple, int] = {}
        for p in params:
            key = (p.grad.dtype, p.grad.device)
            groups = buckets.setdefault(key, [[]])
            if groups[-1] and sizes[key] + p.grad.numel() > BUCKET_ELEMENTS:
                groups.append([])
                sizes[key] = 0
            groups[-1].append(p.grad)
            sizes[key] = sizes.get(key, 0) + p.grad.numel()
        for groups in buckets.values():
            for grads in groups:
                flat = torch.cat([g.reshape(-1) for g in grads])
                torch.distributed.all_reduce(flat)  # SUM: gloo has no AVG
                flat.div_(world)
                offset = 0
                for g in grads:
                    g.copy_(flat[offset : offset + g.numel()].view_as(g))
                    offset += g.numel()

    # ------------------------------------------------------------------------------------------------ scoring
    def token_logps(
        self,
        model: nn.Module,
        batch: dict[str, Any],
        temperature: float,
        with_entropy: bool = False,
        sequences: str = "reflection",
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log phi(y_j | x, y_<j) of every column of ``reflection_ids`` (0 where there is no generated token), from one
        forward that keeps the logits of the generated span only (left padding puts it in the last columns).
        ``sequences="teacher"``: the same for the oracle targets (``teacher_ids`` / ``_mask`` / ``_token_mask``)."""
        ids, mask = batch[f"{sequences}_ids"], batch[f"{sequences}_mask"]
        tokens = batch[f"{sequences}_token_mask"]
        span = int(tokens.sum(-1).max().item()) if tokens.numel() else 0
        out = torch.zeros(ids.shape, device=ids.device)
        if span == 0 and torch.is_grad_enabled() and ids.shape[1] > 1:
            # a micro-batch of padding rows only (a process with fewer turns than another): the forward still runs,
            # its terms masked to 0, so every trainable parameter gets a (zero) gradient on every process, as the
            # gradient all-reduce (DDP's or the learner's own) needs
            span = 1
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
        if self._accelerator is not None and logp.requires_grad:
            logp.register_hook(self._queue_average)
        terms = rl_math.reflection_token_losses(
            logp,
            inputs["old_reflection_logps"],
            inputs["reflection_token_mask"],
            inputs.get("reflection_advantages", inputs["advantages"]),
            clip_low=clip_low,
            clip_high=clip_high,
            ref_logp=inputs.get("ref_reflection_logps") if beta != 0.0 else None,
        )
        tokens = inputs["reflection_token_mask"]
        turn_entropy = (entropy * tokens).sum(-1) / tokens.sum(-1).clamp(min=1.0)
        return terms, turn_entropy

    def sft_losses(self, inputs: dict[str, Any]) -> torch.Tensor:
        """``reflection_objective: oracle_sft``: the per-turn NLL of the oracle reflection (``rl_math`` section 4,
        L^S_t), at temperature 1 (as SFT)."""
        logp, _ = self.token_logps(self.model, inputs, 1.0, sequences="teacher")
        if self._accelerator is not None and logp.requires_grad:
            logp.register_hook(self._queue_average)
        return rl_math.reflection_sft_losses(logp, inputs["teacher_token_mask"])

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
