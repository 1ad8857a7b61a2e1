"""``ReflectPPOConfig``: ``GRPOConfig`` plus the Reflect-RL knobs, with the GRPO options that do not apply refused.

``ReflectPPOTrainer`` keeps GRPOTrainer's optimizer, accelerate/DeepSpeed/FSDP wiring, PEFT, reference model,
checkpointing and logging, but writes its own rollouts (two-player environment episodes) and its own loss
(``reflect_trl.rl_math``). GRPO options that only make sense for GRPO's text completions or GRPO's loss variants
are rejected here, at config time, with the reason and the setting to use instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.trainer_utils import SchedulerType
from trl import GRPOConfig

from reflect_trl import rl_math
from reflect_trl.batching import DEFAULT_SHARED_PREFIX_MIN_TOKENS
from reflect_trl.config_lists import parse_int_list, parse_list
from reflect_trl.envs.base import SPLITS
from reflect_trl.prompts import parse_option_labels
from reflect_trl.reflection.cache import DEFAULT_REFLECTION_CACHE_SIZE
from reflect_trl.trainers.ref_logps_memo import DEFAULT_REF_LOGPS_MEMO_SIZE

#: The one loss this trainer implements (``rl_math.turn_losses``): PPO's clipped surrogate per turn, normalised by
#: the number of real turns in the accumulation window over all processes.
LOSS_TYPE = "turn_ppo"

# (field, value GRPO uses by default, why it does not apply here)
_UNSUPPORTED_GRPO_OPTIONS: tuple[tuple[str, object, str], ...] = (
    (
        "use_vllm",
        False,
        "rollouts are environment episodes played by reflect-trl (the policy scores options in one forward pass); "
        "to serve the reflection model from an inference server use reflection_backend='openai'",
    ),
    ("reward_weights", None, "rewards come from the environment; there are no reward functions to weight"),
    (
        "top_entropy_quantile",
        1.0,
        "there is one (option) token per turn; token filtering by entropy does not apply",
    ),
    ("off_policy_mask_threshold", None, "not implemented by the turn-level PPO loss"),
    (
        "use_adaptive_entropy",
        False,
        "not supported with the option loss: on DangerousTaxi it kept the option entropy but did not improve the "
        "policy (docs/experiments.md, what was tried); use a fixed entropy_coef",
    ),
    ("delta", None, "two-sided ratio clipping is not implemented by the turn-level PPO loss"),
    ("mask_truncated_completions", False, "completions are single option labels and are never truncated"),
    ("log_completions", False, "episodes are written by log_episodes_every / num_logged_episodes"),
    ("top_k", 0, "the policy samples over the offered options at `temperature`; top-k is not applied"),
    ("top_p", 1.0, "the policy samples over the offered options at `temperature`; top-p is not applied"),
    ("min_p", None, "the policy samples over the offered options at `temperature`; min-p is not applied"),
    ("repetition_penalty", 1.0, "one token per turn: no repetition"),
    ("generation_kwargs", None, "the policy does not call generate (one forward pass per turn)"),
    ("use_transformers_paged", False, "the policy does not call generate (one forward pass per turn)"),
    (
        "use_transformers_continuous_batching",
        False,
        "the policy does not call generate (one forward pass per turn)",
    ),
)


#: ``reflection_objective`` values: the reflection player learns by RL, or by SFT towards the oracle's text (a control)
REFLECTION_OBJECTIVES = ("rl", "oracle_sft")


@dataclass
class ReflectPPOConfig(GRPOConfig):
    """GRPOConfig plus the Reflect-RL knobs. Batch semantics: each process runs
    ``per_device_train_batch_size * steps_per_generation`` episodes per rollout (``num_generations`` episodes per
    task, for the group baselines); every turn of every episode is one training sample."""

    # GRPOConfig fields whose defaults differ here.
    disable_dropout: bool = field(
        default=True,
        metadata={"help": "Disable dropout so rollout and training log-probs agree (PPO ratio = 1)."},
    )
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={
            "help": "Deprecated alias of activation_checkpointing (transformers 5.24); default: activation "
            "checkpointing on CUDA (as in TRL), off on CPU, where it only costs time."
        },
    )
    loss_type: str = field(
        default=LOSS_TYPE,
        metadata={"help": f"Only {LOSS_TYPE!r}: PPO's clipped surrogate per turn (reflect_trl.rl_math)."},
    )
    num_generations: int | None = field(default=4, metadata={"help": "Episodes per task (group baseline)."})
    max_completion_length: int | None = field(default=1, metadata={"help": "Always 1: one option label."})
    learning_rate: float = field(default=1e-5, metadata={"help": "AdamW learning rate."})
    scale_rewards: str = field(
        default="group",
        metadata={
            "help": "gigpo, and the verified reflection reward: divide the episode and step advantages (the "
            "reflections' same-state advantages) by their group's std ('group') or by 1 ('none')."
        },
    )
    scale_std_floor: float = field(
        default=0.1,
        metadata={
            "help": "gigpo with scale_rewards 'group': the smallest std a group's returns are divided by (reward "
            "units), so returns that differ only by discounting (0.95^3 vs 0.95^5) are not blown up to +-1."
        },
    )
    lr_scheduler_type: SchedulerType | str = field(
        default="constant",
        metadata={
            "help": "Learning-rate schedule: constant (the paper's RL loop), or any transformers scheduler."
        },
    )
    lr_schedule_per_stage: bool = field(
        default=False,
        metadata={
            "help": "Restart the learning-rate schedule (warm-up, decay) at each curriculum stage instead of running "
            "it once over max_steps (curriculum_schedule 'steps' only)."
        },
    )
    env_name: str = field(
        default="taxi",
        metadata={
            "aliases": ["--env"],
            "help": "Registered environment name (YAML key env_name: TrlParser reserves env).",
        },
    )
    env_kwargs: dict | str | None = field(
        default=None, metadata={"help": "Environment kwargs (dict or JSON)."}
    )
    eval_env_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": "Environment kwargs of the evaluation during training (dict or JSON); default: env_kwargs without "
            "the environment's training-only kwargs (TextEnv.training_only_kwargs, e.g. AutoExplore's leaveout_prob)."
        },
    )
    reflection_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Frozen reflection model (hub id or local dir). None/'none' = no reflection."},
    )
    reflection_max_new_tokens: int = field(default=64, metadata={"help": "Token budget of one reflection."})
    reflection_temperature: float = field(
        default=1.0, metadata={"help": "Reflection sampling temperature (0 = greedy)."}
    )
    reflection_cache_size: int = field(
        default=DEFAULT_REFLECTION_CACHE_SIZE,
        metadata={
            "help": "With reflection_temperature 0: remember up to this many reflections by their prompt, so each "
            "distinct prompt is generated once (reflect_trl.reflection.cache). 0 disables the memo."
        },
    )
    ref_logps_memo_size: int = field(
        default=DEFAULT_REF_LOGPS_MEMO_SIZE,
        metadata={
            "help": "Reference log-probs of up to this many turns kept: a repeated turn needs no reference "
            "forward (0: off)."
        },
    )
    shared_prefix_min_tokens: int = field(
        default=DEFAULT_SHARED_PREFIX_MIN_TOKENS,
        metadata={
            "help": "Encode the prompts' common prefix (>= this many tokens) once per policy forward "
            "(0: off)."
        },
    )
    reflection_load_in_8bit: bool = field(
        default=False, metadata={"help": "Load the reflection model in 8-bit."}
    )
    reflection_load_in_4bit: bool = field(
        default=False, metadata={"help": "Load the reflection model in 4-bit."}
    )
    reflection_dtype: str = field(default="auto", metadata={"help": "dtype of the reflection model."})
    reflection_device: str | None = field(
        default=None,
        metadata={"help": "Device of the reflection model (default: the policy's, e.g. cuda:1)."},
    )
    reflection_backend: str = field(
        default="hf",
        metadata={
            "help": "hf: the reflection model runs in this process; openai: an OpenAI-compatible completions server "
            "(vLLM, SGLang, TGI, transformers serve) runs it (docs/serving.md)."
        },
    )
    reflection_base_url: str | None = field(
        default=None,
        metadata={"help": "openai backend: the server's base URL, e.g. http://127.0.0.1:8000/v1."},
    )
    reflection_server_model: str | None = field(
        default=None,
        metadata={
            "help": "openai backend: the served model's name (default: reflection_model_name_or_path)."
        },
    )
    reflection_api_key_env: str = field(
        default="REFLECT_TRL_REFLECTION_API_KEY",
        metadata={
            "help": "openai backend: environment variable holding the API key (never put keys in recipes)."
        },
    )
    reflection_concurrency: int = field(
        default=32, metadata={"help": "openai backend: requests in flight per process."}
    )
    reflection_timeout: float = field(default=60.0, metadata={"help": "openai backend: seconds per request."})
    reflection_max_retries: int = field(
        default=3,
        metadata={"help": "openai backend: retries of a failed request (then the run stops cleanly)."},
    )
    train_reflection: bool = field(
        default=False,
        metadata={
            "help": "Train the reflection player too (beyond the paper: there it is frozen) on its sampled reflection "
            "tokens (rl_math section 4), from reflection_reward (or by reflection_objective oracle_sft); needs "
            "reflection_temperature > 0 and the in-process backend. Saved in <output_dir>/reflection."
        },
    )
    train_policy: bool = field(
        default=True, metadata={"help": "Train the policy (false: only the reflection player learns)."}
    )
    reflection_learning_rate: float = field(
        default=1e-5, metadata={"help": "train_reflection: the reflection player's learning rate."}
    )
    reflection_beta: float = field(
        default=0.05,
        metadata={
            "help": "train_reflection: weight of the reflection's k3 KL to the SFT'd reflection model."
        },
    )
    reflection_reward: str = field(
        default="advantage",
        metadata={
            "help": "train_reflection: what the reflection's tokens learn from (rl_math section 4). advantage: the "
            "policy's turn advantage; verified: a reward of its own, 1 when the move it names is optimal at that "
            "state (the environment's optimal_actions: its oracle), 0 for another move, -reflection_no_move_penalty "
            "for none, made group-relative over the reflections sampled at the same state; mixed: "
            "(1 - w) * advantage + w * verified (w = reflection_verified_weight)."
        },
    )
    reflection_verified_weight: float = field(
        default=0.5,
        metadata={"help": "reflection_reward mixed: weight w of the verified advantage, in [0, 1]."},
    )
    reflection_no_move_penalty: float = field(
        default=0.5,
        metadata={
            "help": "reflection_reward verified / mixed: a reflection that names no legal move is rewarded "
            "-penalty (one naming a non-optimal move gets 0)."
        },
    )
    reflection_objective: str = field(
        default="rl",
        metadata={
            "help": "train_reflection: rl (the clipped surrogate with reflection_reward), or oracle_sft (a control: "
            "supervised fine-tuning, at the states the current pair visits, towards the environment's oracle "
            "reflector's text -- DAgger-style on-policy supervision; reflection_reward is not used)."
        },
    )
    advantage_estimator: str = field(
        default="gigpo", metadata={"help": "reinforce | rloo | gae | gigpo (reflect_trl.rl_math)"}
    )
    gamma: float = field(
        default=0.95, metadata={"help": "Discount over turns (GiGPO: 0.95, a loop penalty)."}
    )
    gae_lambda: float = field(default=0.95, metadata={"help": "GAE lambda."})
    step_advantage_weight: float = field(
        default=1.0, metadata={"help": "gigpo: weight omega of the state-grouped step advantage."}
    )
    reinforce_baseline: str = field(default="batch", metadata={"help": "REINFORCE baseline: none | batch"})
    whiten_advantages: bool | None = field(
        default=None,
        metadata={
            "help": "Normalise advantages over the rollout batch; default: off for gigpo (already normalised per "
            "group), on for the others."
        },
    )
    skip_no_signal_steps: bool = field(
        default=False,
        metadata={
            "help": "Skip every optimizer step in which no turn on any process has a non-zero advantage (every "
            "group's episodes ended alike, no replayed turn), instead of letting the KL term alone pull the policy "
            "back to the reference: a stage without any success leaves the policy where the last one put it, which "
            "also keeps it from the reference's exploration (DAPO's dynamic sampling, simplest form). On a skipped "
            "step the loss is zeroed (backward still runs, so DDP / FSDP stay in step), neither the optimizer (no "
            "weight, AdamW moment or weight-decay update) nor the learning-rate scheduler steps, and global_step "
            "still counts it (max_steps, logging, saving and the step curriculum see it; the learning-rate schedule "
            "lags by the skipped steps). Not supported with DeepSpeed."
        },
    )
    vf_coef: float = field(default=0.5, metadata={"help": "Value-loss weight (gae)."})
    value_clip: float = field(default=0.2, metadata={"help": "Value clipping range (gae)."})
    replay_buffer_size: int = field(
        default=0, metadata={"help": "Successful-turn replay capacity (0 = off)."}
    )
    replay_samples: int = field(default=8, metadata={"help": "Replayed turns added to each rollout batch."})
    replay_weight: float = field(
        default=0.1, metadata={"help": "Advantage given to replayed successful turns."}
    )
    curriculum: bool = field(default=True, metadata={"help": "Train stage by stage (easy first)."})
    curriculum_stages: list[str] | None = field(
        default=None, metadata={"help": "Stages to train on (default: the env's stages)."}
    )
    curriculum_schedule: str = field(default="steps", metadata={"help": "steps | success"})
    # Parsed as strings so that `0,50,100`, `0 50 100` and a YAML list all work; converted to ints after parsing.
    curriculum_stage_starts: list[str] | None = field(
        default=None,
        metadata={"help": "Optimizer step at which each stage starts (schedule=steps), e.g. 0,50,100."},
    )
    curriculum_threshold: float = field(
        default=0.8, metadata={"help": "Success rate that promotes (success)."}
    )
    curriculum_window: int = field(default=64, metadata={"help": "Episodes in the success window (success)."})
    num_train_tasks: int = field(default=256, metadata={"help": "Training tasks per stage."})
    train_tasks_file: str | None = field(
        default=None,
        metadata={
            "help": "A JSONL file of training tasks (one Task dict per line, e.g. start states disjoint from the SFT "
            "data); replaces num_train_tasks / task_seed."
        },
    )
    task_seed: int = field(default=0, metadata={"help": "Seed of the task generator."})
    shuffle_options: bool = field(default=False, metadata={"help": "Seeded shuffling of the option order."})
    option_labels: str | None = field(
        default=None,
        metadata={
            "help": "Option labels: a list, 'A,B,C' or 'ABC' (default: those recorded with the policy, else "
            "A-Z a-z 0-9)."
        },
    )
    max_prompt_length: int | None = field(
        default=None, metadata={"help": "Left-truncate policy prompts to this."}
    )
    # Evaluation during training (TrainingArguments' eval_strategy / eval_steps / eval_on_start /
    # load_best_model_at_end): greedy episodes on held-out tasks, as `reflect-trl eval --decodings greedy`.
    eval_episodes_per_stage: int = field(
        default=100,
        metadata={
            "help": "Greedy episodes per stage of an evaluation during training (as `reflect-trl eval`)."
        },
    )
    eval_split: str = field(default="validation", metadata={"help": "Task split of the evaluation episodes."})
    eval_seed: int = field(
        default=777, metadata={"help": "Seed of the evaluation tasks (`reflect-trl eval --seed`)."}
    )
    num_generations_eval: int | None = field(
        default=1,
        metadata={"help": "Episodes per evaluation task: the greedy evaluation plays each task once."},
    )
    per_device_eval_batch_size: int = field(
        default=64, metadata={"help": "Evaluation episodes each process plays in lock-step."}
    )
    log_episodes_every: int = field(default=50, metadata={"help": "Every N rollouts, log sample episodes."})
    num_logged_episodes: int = field(default=2, metadata={"help": "Episodes per episode table."})

    def __post_init__(self) -> None:
        for name in ("env_kwargs", "eval_env_kwargs"):
            value = getattr(self, name)
            if isinstance(value, str):
                try:
                    value = json.loads(value) if value.strip() else None
                except json.JSONDecodeError as err:
                    raise ValueError(f"{name} is not valid JSON: {value!r} ({err})") from err
            if value is not None and not isinstance(value, dict):
                raise ValueError(f"{name} must be a mapping, got {value!r}")
            setattr(self, name, value)
        if self.eval_env_kwargs:
            # no training-only kwarg (envs.base.check_evaluation_kwargs) unless the "allow_training_only_kwargs" key
            # names it
            from reflect_trl.envs.base import checked_eval_env_kwargs

            self.eval_env_kwargs = checked_eval_env_kwargs(self.env_name, self.eval_env_kwargs)
        if self.reflection_model_name_or_path in ("", "none", "None"):
            self.reflection_model_name_or_path = None
        from reflect_trl.reflection.player import REFLECTION_BACKENDS

        if self.reflection_backend not in REFLECTION_BACKENDS:
            raise ValueError(
                f"reflection_backend={self.reflection_backend!r}; choose one of {REFLECTION_BACKENDS}"
            )
        if self.reflection_backend == "openai":
            if not self.reflection_base_url:
                raise ValueError(
                    "reflection_backend='openai' needs reflection_base_url (e.g. http://127.0.0.1:8000/v1)"
                )
            if not (self.reflection_server_model or self.reflection_model_name_or_path):
                raise ValueError(
                    "reflection_backend='openai' needs the served model's name: reflection_server_model "
                    "(or reflection_model_name_or_path)"
                )
        if self.reflection_cache_size < 0:
            raise ValueError(
                f"reflection_cache_size must be >= 0 (0 disables the memo), got {self.reflection_cache_size}"
            )
        if self.ref_logps_memo_size < 0:
            raise ValueError(
                f"ref_logps_memo_size must be >= 0 (0 disables the memo), got {self.ref_logps_memo_size}"
            )
        if self.shared_prefix_min_tokens < 0:
            raise ValueError(
                f"shared_prefix_min_tokens must be >= 0 (0 disables it), got {self.shared_prefix_min_tokens}"
            )
        if self.advantage_estimator not in rl_math.ADVANTAGE_ESTIMATORS:
            raise ValueError(
                f"advantage_estimator={self.advantage_estimator!r}; choose one of {rl_math.ADVANTAGE_ESTIMATORS}"
            )
        if self.loss_type != LOSS_TYPE:
            raise ValueError(
                f"loss_type={self.loss_type!r}: ReflectPPOTrainer implements one loss, {LOSS_TYPE!r} (PPO's clipped "
                "surrogate per turn, normalised by the real turns of the accumulation window over all processes; "
                "reflect_trl.rl_math.turn_losses). Remove loss_type from the config."
            )
        for name, default, why in _UNSUPPORTED_GRPO_OPTIONS:
            if getattr(self, name) != default:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} is not supported by ReflectPPOTrainer: {why}"
                )
        if self.scale_rewards not in ("group", "none"):
            raise ValueError(
                f"scale_rewards={self.scale_rewards!r}; for gigpo choose 'group' (std) or 'none' (1)"
            )
        if (
            self.advantage_estimator != "gigpo"
            and self.scale_rewards != "group"
            and self.reflection_reward == "advantage"
        ):
            raise ValueError(
                f"scale_rewards={self.scale_rewards!r} applies to advantage_estimator='gigpo' only "
                f"(this run uses {self.advantage_estimator!r}; see whiten_advantages)"
            )
        if self.max_completion_length not in (None, 1):
            raise ValueError(
                f"max_completion_length={self.max_completion_length}: the policy answers with one option-label "
                "token; leave it at 1"
            )
        self.max_completion_length = 1
        labels = parse_option_labels(self.option_labels)
        self.option_labels = None if labels is None else ",".join(labels)
        self.curriculum_stages = parse_list(self.curriculum_stages, "curriculum_stages")
        self.curriculum_stage_starts = parse_int_list(self.curriculum_stage_starts, "curriculum_stage_starts")
        if self.activation_checkpointing is None and self.gradient_checkpointing is None:
            # TRL's default on GPUs, where it saves memory; on a CPU it only recomputes activations (~1/3 more time)
            self.activation_checkpointing = bool(torch.cuda.is_available() and not self.use_cpu)
        if self.ddp_find_unused_parameters is None:
            # Every trainable parameter receives a gradient in every backward; the gae value head does so from
            # outside the DDP module's forward, which the unused-parameter search would mark ready a second time.
            # (An MoE policy whose experts may go unused in a batch needs True, and then no value head.)
            self.ddp_find_unused_parameters = False
        if self.eval_split not in SPLITS:
            raise ValueError(f"eval_split={self.eval_split!r}; choose one of {SPLITS}")
        if self.eval_episodes_per_stage < 1:
            raise ValueError(f"eval_episodes_per_stage must be >= 1, got {self.eval_episodes_per_stage}")
        if self.load_best_model_at_end and self.metric_for_best_model is None:
            # TrainingArguments would pick "loss", which this evaluation does not compute
            self.metric_for_best_model = "success_rate"
        if self.reinforce_baseline not in ("none", "batch"):
            raise ValueError(f"reinforce_baseline={self.reinforce_baseline!r}; choose 'none' or 'batch'")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma={self.gamma} must be in [0, 1]")
        if self.train_reflection:
            if self.reflection_backend != "hf":
                raise ValueError(
                    "train_reflection trains the reflection model in this process: reflection_backend must be 'hf' "
                    f"(got {self.reflection_backend!r}; a served model cannot be trained from here)"
                )
            if self.reflection_temperature <= 0:
                raise ValueError(
                    "train_reflection learns from sampled reflections: set reflection_temperature > 0 (e.g. 1.0), "
                    f"got {self.reflection_temperature}"
                )
            if self.reflection_learning_rate <= 0 or self.reflection_beta < 0:
                raise ValueError(
                    f"reflection_learning_rate must be > 0 and reflection_beta >= 0, got "
                    f"{self.reflection_learning_rate} and {self.reflection_beta}"
                )
        from reflect_trl.rl_math import REFLECTION_REWARDS

        if self.reflection_reward not in REFLECTION_REWARDS:
            raise ValueError(
                f"reflection_reward={self.reflection_reward!r}; choose one of {', '.join(REFLECTION_REWARDS)}"
            )
        if self.reflection_objective not in REFLECTION_OBJECTIVES:
            raise ValueError(
                f"reflection_objective={self.reflection_objective!r}; choose one of {', '.join(REFLECTION_OBJECTIVES)}"
            )
        if not 0.0 <= self.reflection_verified_weight <= 1.0:
            raise ValueError(
                f"reflection_verified_weight must be in [0, 1], got {self.reflection_verified_weight}"
            )
        if self.reflection_no_move_penalty < 0:
            raise ValueError(
                f"reflection_no_move_penalty must be >= 0 (the reward is -penalty), got "
                f"{self.reflection_no_move_penalty}"
            )
        if not self.train_reflection:
            for name, default in (("reflection_reward", "advantage"), ("reflection_objective", "rl")):
                if getattr(self, name) != default:
                    raise ValueError(
                        f"{name}={getattr(self, name)!r} is about the reflection player's training: set "
                        "train_reflection=true"
                    )
        if not self.train_policy and not self.train_reflection:
            raise ValueError("train_policy=false leaves nothing to train: set train_reflection=true")
        if self.whiten_advantages is None:
            self.whiten_advantages = self.advantage_estimator != "gigpo"
        if self.scale_std_floor < 0:
            raise ValueError(f"scale_std_floor must be >= 0, got {self.scale_std_floor}")
        if self.lr_schedule_per_stage and (not self.curriculum or self.curriculum_schedule != "steps"):
            raise ValueError(
                "lr_schedule_per_stage restarts the schedule at the stages of a curriculum_schedule 'steps' "
                "curriculum (the stage starts are known in advance); this run has "
                + (
                    "no curriculum"
                    if not self.curriculum
                    else f"curriculum_schedule={self.curriculum_schedule!r}"
                )
            )
        super().__post_init__()
        if self.steps_per_generation % self.gradient_accumulation_steps != 0:
            raise ValueError(
                f"steps_per_generation={self.steps_per_generation} must be a multiple of "
                f"gradient_accumulation_steps={self.gradient_accumulation_steps}: the loss is normalised by the real "
                "turns of each accumulation window, which must lie inside one rollout batch"
            )

    def check_stage_schedule(self, stages: list[str]) -> None:
        """The step schedule of the curriculum fits ``stages`` (raises :class:`~reflect_trl.errors.UsageError`)."""
        from reflect_trl.errors import UsageError

        if (
            self.curriculum
            and self.curriculum_schedule == "steps"
            and not self.curriculum_stage_starts
            and self.max_steps < len(stages)
        ):
            raise UsageError(
                f"curriculum_schedule='steps' splits max_steps={self.max_steps} into {len(stages)} stages {stages}; "
                "set max_steps >= the number of stages, give curriculum_stage_starts, or use "
                "curriculum_schedule='success'"
            )
        if self.curriculum_stage_starts and len(self.curriculum_stage_starts) != len(stages):
            raise UsageError(
                f"curriculum_stage_starts {self.curriculum_stage_starts}: one start step per stage {stages}"
            )

    def reflection_server_settings(self) -> dict[str, Any]:
        """How to reach the served reflection model (``reflection_backend: openai``): keyword arguments of
        :func:`~reflect_trl.reflection.player.make_reflection_player` and of the up-front server check."""
        return {
            "base_url": self.reflection_base_url,
            "model_name": self.reflection_server_model or self.reflection_model_name_or_path,
            "api_key_env": self.reflection_api_key_env,
            "concurrency": self.reflection_concurrency,
            "timeout": self.reflection_timeout,
            "max_retries": self.reflection_max_retries,
        }

    @property
    def evaluation_env_kwargs(self) -> dict[str, Any]:
        """The kwargs of evaluation environments: ``eval_env_kwargs``, else ``env_kwargs`` without the environment's
        training-only kwargs."""
        if self.eval_env_kwargs is not None:
            return dict(self.eval_env_kwargs)
        from reflect_trl.envs import get_env_class

        training_only = set(get_env_class(self.env_name).training_only_kwargs)
        return {k: v for k, v in (self.env_kwargs or {}).items() if k not in training_only}

    @property
    def labels(self) -> tuple[str, ...] | None:
        """The configured option labels (None: those recorded with the policy, else the defaults)."""
        return parse_option_labels(self.option_labels)


#: The titled groups of ``ReflectPPOConfig``'s own fields and of the GRPOConfig fields whose defaults differ, for its
#: docstring (GRPOConfig's style); ``tests/trainers/test_rl_config_doc.py`` checks that every own field is in one.
FIELD_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "Parameters that control the environment and its tasks",
        ("env_name", "env_kwargs", "eval_env_kwargs", "num_train_tasks", "task_seed", "train_tasks_file")
        + ("option_labels", "shuffle_options", "max_prompt_length"),
    ),
    (
        "Parameters that control the reflection player",
        ("reflection_model_name_or_path", "reflection_max_new_tokens", "reflection_temperature")
        + ("reflection_cache_size", "reflection_dtype", "reflection_device", "reflection_load_in_8bit")
        + ("reflection_load_in_4bit", "reflection_backend", "reflection_base_url", "reflection_server_model")
        + (
            "reflection_api_key_env",
            "reflection_concurrency",
            "reflection_timeout",
            "reflection_max_retries",
        ),
    ),
    (
        "Parameters that control the reflection player as a learner (beyond the paper)",
        (
            "train_reflection",
            "train_policy",
            "reflection_learning_rate",
            "reflection_beta",
            "reflection_reward",
        )
        + ("reflection_verified_weight", "reflection_no_move_penalty")
        + ("reflection_objective",),
    ),
    (
        "Parameters that control the advantages",
        (
            "advantage_estimator",
            "gamma",
            "gae_lambda",
            "step_advantage_weight",
            "scale_rewards",
            "scale_std_floor",
        )
        + ("reinforce_baseline", "whiten_advantages", "skip_no_signal_steps"),
    ),
    (
        "Parameters that control the objective and the optimisation",
        ("loss_type", "num_generations", "max_completion_length", "learning_rate", "lr_scheduler_type")
        + ("lr_schedule_per_stage", "disable_dropout", "gradient_checkpointing", "vf_coef", "value_clip"),
    ),
    (
        "Parameters that control the replay of successes (the paper's)",
        ("replay_buffer_size", "replay_samples", "replay_weight"),
    ),
    (
        "Parameters that control the curriculum",
        ("curriculum", "curriculum_stages", "curriculum_schedule", "curriculum_stage_starts")
        + ("curriculum_threshold", "curriculum_window"),
    ),
    (
        "Parameters that control evaluation and logging",
        ("eval_episodes_per_stage", "eval_split", "eval_seed", "log_episodes_every", "num_logged_episodes"),
    ),
    ("Parameters that control speed and memory", ("ref_logps_memo_size", "shared_prefix_min_tokens")),
)


def _fields_docstring(cls: type, groups: tuple[tuple[str, tuple[str, ...]], ...]) -> str:
    """GRPOConfig's docstring layout for ``groups``: a titled block per group, each field with its type, default and
    help text (the ``help`` metadata, the same text as ``reflect-trl rl --help``)."""
    import textwrap
    from dataclasses import MISSING, fields

    by_name = {f.name: f for f in fields(cls)}
    lines = ["", "    Parameters:"]
    for title, names in groups:
        lines += [f"        > {title}", ""]
        for name in names:
            f = by_name[name]
            default = f.default if f.default is not MISSING else None
            kind = getattr(f.type, "__name__", None) or str(f.type)
            lines.append(f"        {name} (`{kind}`, defaults to `{default!r}`):")
            wrapped = textwrap.wrap(f.metadata.get("help", ""), width=104)
            lines += [f"            {line}" for line in wrapped]
        lines.append("")
    return "\n".join(lines)


ReflectPPOConfig.__doc__ = (
    (ReflectPPOConfig.__doc__ or "") + "\n" + _fields_docstring(ReflectPPOConfig, FIELD_GROUPS)
)

__all__ = ["FIELD_GROUPS", "LOSS_TYPE", "REFLECTION_OBJECTIVES", "ReflectPPOConfig"]
