"""Option-restricted action head: score only the option-label tokens, in one forward pass.

Instead of swapping the LM head (as the reference code did), we gather the logits of the label tokens at the
prompt's last position. This works unchanged on PEFT-wrapped, DeepSpeed- or FSDP-wrapped models.

For a batch of prompts and ``n_b`` options offered in prompt ``b``:

    z_b = logits(prompt_b)[-1, label_ids]            # (L,) label logits
    z_b[i] = -inf  for i >= n_b                      # options not offered get probability 0
    log pi(i | prompt_b) = log_softmax(z_b / T)[i]

:func:`option_forward` is the one place that runs this forward: the rollout's policy actor, the RL loss and its old /
reference scoring, the SFT option metrics and :class:`~reflect_trl.agent`-style inference all call it. Prompts of one
batch that share at least ``shared_prefix_min_tokens`` leading tokens have that prefix encoded once at batch size 1 and
reused from its KV cache by every row (:func:`reflect_trl.batching.shared_prefix_forward`; the same results up to
float rounding).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from reflect_trl.batching import left_pad, position_ids_from_mask, shared_prefix_forward, shared_prefix_length
from reflect_trl.prompts import ACTION_CUE, DEFAULT_LABELS, label_token_ids

logger = logging.getLogger(__name__)

#: Models whose forward rejected a prebuilt KV cache (they get plain forwards from then on).
_PREFIX_REJECTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def options_mask(num_options: torch.Tensor, num_labels: int) -> torch.Tensor:
    """(B, L) boolean mask, True where option ``i < num_options[b]`` is offered."""
    arange = torch.arange(num_labels, device=num_options.device)
    return arange.unsqueeze(0) < num_options.unsqueeze(1)


def masked_log_probs(
    label_logits: torch.Tensor, num_options: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Log-probabilities over the offered options; ``-inf`` for options not offered."""
    mask = options_mask(num_options.to(label_logits.device), label_logits.shape[-1])
    logits = (label_logits.float() / temperature).masked_fill(~mask, float("-inf"))
    return torch.log_softmax(logits, dim=-1)


class OptionForward(NamedTuple):
    """What :func:`option_forward` returns for a batch of prompts."""

    log_probs: torch.Tensor  # (B, L) log pi over the offered options, -inf elsewhere
    hidden: torch.Tensor | None  # (B, H) last-layer hidden state at the last prompt position (when asked)
    aux_loss: (
        torch.Tensor | None
    )  # MoE router load-balancing loss of the forward (when the model returns one)


def option_forward(
    model,
    sequences: Sequence[Sequence[int]],
    pad_id: int,
    label_ids: torch.Tensor,
    num_options: Sequence[int] | torch.Tensor,
    *,
    temperature: float = 1.0,
    shared_prefix_min_tokens: int = 0,
    output_hidden_states: bool = False,
    **forward_kwargs: Any,
) -> OptionForward:
    """One forward of ``model`` over the token lists ``sequences`` keeping only the last position: the option table
    (section of the module docstring), the last hidden state and the router loss. Gradients flow when enabled."""
    device = next(model.parameters()).device
    common = dict(logits_to_keep=1, output_hidden_states=output_hidden_states, **forward_kwargs)
    out = None
    prefix = shared_prefix_length(sequences, shared_prefix_min_tokens)
    if prefix and model not in _PREFIX_REJECTED:
        try:
            out = shared_prefix_forward(model, sequences, prefix, pad_id, **common)
        except (ValueError, TypeError, NotImplementedError, AttributeError) as exc:
            logger.warning(
                "%s cannot reuse a shared-prefix KV cache (%s: %s); using plain forwards",
                type(model).__name__,
                type(exc).__name__,
                exc,
            )
            _PREFIX_REJECTED[model] = True
    if out is None:
        input_ids, attention_mask = left_pad(sequences, pad_id)
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
            **common,
        )
    logits = out.logits[:, -1, :]
    label_logits = logits.index_select(-1, label_ids.to(logits.device))
    n_opt = torch.as_tensor(num_options, device=logits.device)
    hidden = out.hidden_states[-1][:, -1, :] if output_hidden_states else None
    return OptionForward(
        masked_log_probs(label_logits, n_opt, temperature), hidden, getattr(out, "aux_loss", None)
    )


class OptionHead:
    """The option labels of a policy and their token ids (what :func:`option_forward` gathers)."""

    def __init__(self, tokenizer, labels: Sequence[str] = DEFAULT_LABELS, cue: str = ACTION_CUE) -> None:
        self.labels = tuple(labels)
        self.label_ids = torch.tensor(label_token_ids(tokenizer, self.labels, cue), dtype=torch.long)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    def forward(
        self, model, sequences: Sequence[Sequence[int]], num_options: Sequence[int], **kwargs: Any
    ) -> OptionForward:
        """:func:`option_forward` with this head's labels and padding token."""
        return option_forward(model, sequences, self.pad_id, self.label_ids, num_options, **kwargs)

    @staticmethod
    def select(
        log_probs: torch.Tensor, greedy: bool = False, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Sample (or argmax) one option per row."""
        if greedy:
            return log_probs.argmax(-1)
        probs = log_probs.exp()
        return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(log_probs.device)
