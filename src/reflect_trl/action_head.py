"""Option-restricted action head: score only the option-label tokens, in one forward pass.

Instead of swapping the LM head (as the reference code did), we gather the logits of the label tokens at the
prompt's last position. This works unchanged on PEFT-wrapped, DeepSpeed- or FSDP-wrapped models.

For a batch of left-padded prompts and ``n_b`` options offered in prompt ``b``:

    z_b = logits(prompt_b)[-1, label_ids]            # (L,) label logits
    z_b[i] = -inf  for i >= n_b                      # options not offered get probability 0
    log pi(i | prompt_b) = log_softmax(z_b / T)[i]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from reflect_trl.batching import position_ids_from_mask
from reflect_trl.prompts import ACTION_CUE, DEFAULT_LABELS, label_token_ids


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


def entropy_from_log_probs(log_probs: torch.Tensor) -> torch.Tensor:
    """Entropy of each row of a (possibly -inf-masked) log-probability table."""
    probs = log_probs.exp()
    return -(probs * log_probs.masked_fill(probs == 0, 0.0)).sum(-1)


class OptionHead:
    """Gathers the label-token logits of a causal LM at the last prompt position."""

    def __init__(self, tokenizer, labels: Sequence[str] = DEFAULT_LABELS, cue: str = ACTION_CUE) -> None:
        self.labels = tuple(labels)
        self.label_ids = torch.tensor(label_token_ids(tokenizer, self.labels, cue), dtype=torch.long)

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    def label_logits_from_hidden(self, model, hidden: torch.Tensor) -> torch.Tensor:
        """Label logits from last-position hidden states ``(B, H)`` (only the L label rows of the LM head)."""
        weight = model.get_output_embeddings().weight
        rows = weight.index_select(0, self.label_ids.to(weight.device))
        return hidden.to(rows.dtype) @ rows.T

    def label_logits(
        self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs
    ) -> torch.Tensor:
        """(B, L) label logits of left-padded prompts, from one forward pass that keeps only the last logits.

        Position ids are derived from the attention mask unless given, so that left padding does not shift
        absolute position embeddings (GPT-2).
        """
        if kwargs.get("position_ids") is None:
            kwargs["position_ids"] = position_ids_from_mask(attention_mask)
        out = model(
            input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=1, use_cache=False, **kwargs
        )
        logits = out.logits[:, -1, :]
        return logits.index_select(-1, self.label_ids.to(logits.device))

    def log_probs(
        self,
        model,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        num_options: torch.Tensor,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """(B, L) log-probabilities over each prompt's offered options."""
        return masked_log_probs(self.label_logits(model, input_ids, attention_mask), num_options, temperature)

    @staticmethod
    def select(
        log_probs: torch.Tensor, greedy: bool = False, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Sample (or argmax) one option per row."""
        if greedy:
            return log_probs.argmax(-1)
        probs = log_probs.exp()
        return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(log_probs.device)
