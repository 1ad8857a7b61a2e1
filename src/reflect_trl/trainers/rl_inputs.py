"""Up-front checks of ``reflect-trl rl``: everything a run needs is verified before its output directory, W&B run
or models are created (:func:`check_rl_inputs`)."""

from __future__ import annotations

from pathlib import Path

from reflect_trl.errors import UsageError, usage_errors
from reflect_trl.validation import (
    check_env,
    check_label_tokens,
    check_model_path,
    check_reflection_server,
    load_tokenizer_checked,
)

#: Description of ``reflect-trl rl`` (its ``--help``).
RL_DESCRIPTION = (
    "Stage 2 of Reflect-RL: online RL of the policy in a text environment with a frozen reflection model "
    "(ReflectPPOTrainer, a trl.GRPOTrainer): episodes are played in lock-step, every turn is a sample with a "
    "turn-level advantage, and a curriculum moves from easy to hard stages."
)


def check_rl_inputs(args, model_args):
    """Check the policy and reflection model settings, the environment (name, ``env_kwargs``, curriculum stages),
    the option labels against the policy's tokenizer and the reflection server settings; returns the policy's
    tokenizer. Raises :class:`~reflect_trl.errors.UsageError` naming the setting."""
    from reflect_trl.prompts import resolve_option_labels

    policy = model_args.model_name_or_path
    if not policy:
        raise UsageError(
            "model_name_or_path is required (a hub id or a local directory such as outputs/sft_policy)"
        )
    check_model_path(policy, "model_name_or_path")
    if args.reflection_model_name_or_path:
        check_model_path(args.reflection_model_name_or_path, "reflection_model_name_or_path")
    env = check_env(args.env_name, args.env_kwargs, args.curriculum_stages)
    args.check_stage_schedule(list(args.curriculum_stages or env.stages))
    tokenizer = load_tokenizer_checked(policy, "model_name_or_path")
    with usage_errors("option_labels"):
        labels = resolve_option_labels(
            args.option_labels, policy if Path(policy).is_dir() else None, f"the policy {policy!r}"
        )
    check_label_tokens(tokenizer, labels, "option_labels")
    if args.reflection_backend == "openai":
        check_reflection_server(
            max_new_tokens=args.reflection_max_new_tokens, **args.reflection_server_settings()
        )
    return tokenizer


__all__ = ["RL_DESCRIPTION", "check_rl_inputs"]
