"""reflect-trl: the Reflect-RL recipe (Zhou, Du, Li; ACL 2024) on top of Hugging Face TRL.

Trainers are exported lazily (as TRL does) so that ``import reflect_trl`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from reflect_trl.quiet import quiet_dependencies

__version__ = "0.1.0"

# Notices of dependencies that a reflect-trl user cannot act on, silenced once for the library (not only the CLI).
quiet_dependencies()

_LAZY = {
    "ReflectAgent": "reflect_trl.agent",
    "ReflectSFTConfig": "reflect_trl.trainers.sft_config",
    "ReflectSFTTrainer": "reflect_trl.trainers.sft_trainer",
    "ReflectPPOConfig": "reflect_trl.trainers.rl_config",
    "ReflectPPOTrainer": "reflect_trl.trainers.rl_trainer",
    "make_env": "reflect_trl.envs",
    "list_envs": "reflect_trl.envs",
    "build_prompt": "reflect_trl.prompts",
    "OptionHead": "reflect_trl.action_head",
}

if TYPE_CHECKING:  # pragma: no cover
    from reflect_trl.action_head import OptionHead
    from reflect_trl.agent import ReflectAgent
    from reflect_trl.envs import list_envs, make_env
    from reflect_trl.prompts import build_prompt
    from reflect_trl.trainers.rl_config import ReflectPPOConfig
    from reflect_trl.trainers.rl_trainer import ReflectPPOTrainer
    from reflect_trl.trainers.sft_config import ReflectSFTConfig
    from reflect_trl.trainers.sft_trainer import ReflectSFTTrainer


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'reflect_trl' has no attribute {name!r}")


__all__ = [
    "OptionHead",
    "ReflectAgent",
    "ReflectPPOConfig",
    "ReflectPPOTrainer",
    "ReflectSFTConfig",
    "ReflectSFTTrainer",
    "__version__",
    "build_prompt",
    "list_envs",
    "make_env",
]
