"""``ReflectSFTConfig``: TRL's ``SFTConfig`` plus the Reflect-RL options of the SFT warm-up."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from trl import SFTConfig

from reflect_trl.batching import DEFAULT_SHARED_PREFIX_MIN_TOKENS
from reflect_trl.config_lists import parse_list
from reflect_trl.prompts import DEFAULT_LABELS, parse_option_labels

ROLES = ("policy", "reflection")


@dataclass
class ReflectSFTConfig(SFTConfig):
    """``SFTConfig`` plus the Reflect-RL options.

    Defaults that differ from TRL's, so that the same recipe runs on a laptop CPU and on a GPU:
    ``bf16`` None -> True only on a CUDA device that supports it (TRL: True everywhere, which fails on CPU);
    ``activation_checkpointing`` (alias ``gradient_checkpointing``) None -> True only on CUDA (it only costs
    time on CPU-sized models).
    """

    role: str = field(
        default="policy",
        metadata={
            "help": "What is trained: 'policy' (completion = option label) or 'reflection'.",
            "choices": ROLES,
        },
    )
    curriculum_order: bool = field(
        default=False,
        metadata={"help": "Order each epoch by stage, easy first (needs a 'difficulty' column)."},
    )
    stages: list[str] | None = field(
        default=None,
        metadata={
            "help": "Stage order for curriculum_order (default: order of first appearance in the data)."
        },
    )
    option_labels: list[str] | str | None = field(
        default=None,
        metadata={
            "help": "Option labels: a list, a comma-separated string or one string of single characters (ABCDEF). "
            "Default: the labels recorded next to the data set, else A-Z, a-z, 0-9."
        },
    )
    eval_num_policy_samples: int = field(
        default=256, metadata={"help": "Eval rows scored for eval_option_accuracy (0 = off)."}
    )
    eval_num_reflection_samples: int = field(
        default=32, metadata={"help": "Eval rows whose reflection is generated for eval_stop_rate (0 = off)."}
    )
    reflection_max_new_tokens: int = field(
        default=64, metadata={"help": "Token budget of a generated reflection."}
    )
    reflection_do_sample: bool = field(
        default=False, metadata={"help": "Sample eval reflections (default: greedy decoding)."}
    )
    shared_prefix_min_tokens: int = field(
        default=DEFAULT_SHARED_PREFIX_MIN_TOKENS,
        metadata={
            "help": "The loss runs on each row's trained tail: every token before the one that predicts the row's "
            "first trained label is encoded first into a KV cache -- the rows' common leading tokens once at batch "
            "size 1 when at least this many -- and the fused LM head scores the tails only. The same loss, "
            "gradients and metrics up to float rounding (with dropout, the prefix's dropout mask is shared by the "
            "rows), less compute. 0 disables it, as does a row with fewer context tokens; it is off with activation "
            "checkpointing, padding-free batches and MoE router losses."
        },
    )
    gradient_checkpointing: bool | None = field(
        default=None, metadata={"help": "Deprecated alias of activation_checkpointing (transformers 5.24)."}
    )
    warmup_ratio: float | None = field(
        default=None,
        metadata={
            "help": "Warm-up as a fraction of the steps (transformers 5 folded it into warmup_steps < 1)."
        },
    )

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        on_cuda = torch.cuda.is_available() and not self.use_cpu
        if self.bf16 is None and not self.fp16:
            self.bf16 = bool(on_cuda and torch.cuda.is_bf16_supported())
        if self.activation_checkpointing is None and self.gradient_checkpointing is None:
            self.activation_checkpointing = on_cuda
        if self.warmup_ratio is not None:
            if not 0.0 <= self.warmup_ratio < 1.0:
                raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
            if self.warmup_steps:
                raise ValueError("set either warmup_steps or warmup_ratio, not both")
            self.warmup_steps = self.warmup_ratio
        if self.shared_prefix_min_tokens < 0:
            raise ValueError(
                f"shared_prefix_min_tokens must be >= 0 (0 disables it), got {self.shared_prefix_min_tokens}"
            )
        if self.reflection_max_new_tokens < 1:
            raise ValueError(f"reflection_max_new_tokens must be >= 1, got {self.reflection_max_new_tokens}")
        labels = parse_option_labels(self.option_labels)
        self.option_labels = list(labels) if labels is not None else None
        self.stages = parse_list(self.stages, "stages")
        super().__post_init__()

    @property
    def labels(self) -> tuple[str, ...]:
        """The option labels of the policy prompts (the configured ones, else the defaults)."""
        return tuple(self.option_labels) if self.option_labels else DEFAULT_LABELS


__all__ = ["ROLES", "ReflectSFTConfig"]
