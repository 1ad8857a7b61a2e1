"""Stage 2 of Reflect-RL: online two-player RL of the policy (``ReflectPPOTrainer``).

``ReflectPPOTrainer`` subclasses TRL's ``GRPOTrainer`` (TRL removed ``PPOTrainer`` in 1.13) for what it is good at --
optimizer and scheduler, accelerate / DeepSpeed / FSDP wiring, PEFT, the reference model, ``num_iterations`` PPO
epochs over one rollout batch, checkpointing and logging -- and overrides a few hooks:

* ``_generate_and_score_completions`` (GRPO's extension point, called by ``_prepare_inputs``): draw the rollout's
  tasks (:class:`~reflect_trl.trainers.curriculum.TaskSampler`), play the episodes in lock-step with the reflection
  player and the policy's option head (:class:`~reflect_trl.rollout.RolloutEngine`), compute every turn's advantage
  (``rl_math``), turn every turn into a row and the rows into a batch (:mod:`~reflect_trl.trainers.rl_batch`), then
  add the old and reference log-probs the loss needs;
* ``_prepare_inputs``: GRPO's shuffle / split / buffering, plus the loss normaliser of every micro-batch: the real
  turns of its gradient-accumulation window on all processes;
* ``compute_loss``: the objective of ``rl_math`` (clipped surrogate, exact KL over the options, entropy bonus,
  clipped value loss for ``gae``, the reflection player's token loss with ``train_reflection``), each term a window
  mean (``rl_math.window_mean``), so the gradient is the same on one process or many and for any accumulation; the
  reflection's own reward, its oracle targets and metrics live in
  :class:`~reflect_trl.trainers.reflection_reward.ReflectionRewardMixin`;
* ``evaluate`` (:class:`~reflect_trl.trainers.rl_evaluation.GreedyEvaluationMixin`): greedy held-out episodes;
* ``create_optimizer`` / ``create_scheduler`` (:mod:`~reflect_trl.trainers.signal_guard`): with
  ``skip_no_signal_steps``, no optimizer or scheduler step on a window without a non-zero advantage;
* ``_save_checkpoint`` / ``_load_optimizer_and_scheduler`` / ``save_model``: the task sampler, replay buffer, memos,
  value head and option labels.

``tests/trainers/test_rl_loss.py`` drives hand-built batches through these hooks (1 process and 2 gloo processes)
and compares with hand-computed objectives, so a change of GRPOTrainer's private behaviour fails a test.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from torch import nn
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer
from trl.models import unwrap_model_for_generation
from trl.trainer.utils import use_adapter

from reflect_trl import rl_math
from reflect_trl.action_head import OptionForward, OptionHead
from reflect_trl.batching import checkpointing_drops_cache, unpad_left
from reflect_trl.envs import Task, get_env_class, make_env
from reflect_trl.prompts import resolve_option_labels
from reflect_trl.reflection.cache import with_reflection_cache
from reflect_trl.reflection.player import ReflectionPlayer, make_reflection_player
from reflect_trl.reflection.remote import ReflectionServerError
from reflect_trl.rollout import Episode, PolicyActor, RolloutEngine
from reflect_trl.seeding import derive_seed
from reflect_trl.trainers import rl_batch
from reflect_trl.trainers.curriculum import Curriculum, TaskSampler
from reflect_trl.trainers.paper import REFLECT_RL_PAPER
from reflect_trl.trainers.progress_callback import use_reflect_progress
from reflect_trl.trainers.ref_logps_memo import RefLogpsMemo, turn_key
from reflect_trl.trainers.reflection_learner import ReflectionLearner
from reflect_trl.trainers.reflection_reward import ReflectionRewardMixin
from reflect_trl.trainers.replay import ReplayBuffer, ReplayTurn
from reflect_trl.trainers.rl_config import ReflectPPOConfig
from reflect_trl.trainers.rl_evaluation import GreedyEvaluationMixin
from reflect_trl.trainers.rl_logging import NoSignalMonitor, RolloutLoggingMixin
from reflect_trl.trainers.rl_state import TrainingStateMixin
from reflect_trl.trainers.signal_guard import SignalSkipMixin, check_skip_supported


def environment_reward(*_: Any, **__: Any) -> list[float]:
    """Placeholder reward function: GRPOTrainer requires one, but ReflectPPOTrainer's rewards come from the
    environment inside ``_generate_and_score_completions`` and this is never called."""
    raise RuntimeError("ReflectPPOTrainer takes its rewards from the environment; reward_funcs are not used")


def local_model_dir(model) -> str | None:
    """The local directory a model was loaded from, if any (where its recorded option labels live)."""
    name = getattr(model, "name_or_path", None) or getattr(
        getattr(model, "config", None), "_name_or_path", None
    )
    return str(name) if name and Path(str(name)).is_dir() else None


class ReflectPPOTrainer(
    GreedyEvaluationMixin,
    RolloutLoggingMixin,
    ReflectionRewardMixin,
    SignalSkipMixin,
    TrainingStateMixin,
    GRPOTrainer,
):
    """Online RL of the policy in a text environment, with a reflection model (optional)."""

    _tag_names = ["trl", "reflect-trl", "reflect-rl"]
    _name = "ReflectPPO"
    _paper = REFLECT_RL_PAPER
    #: compute_loss returns each micro-batch's share of the window mean (rl_math.window_mean): Trainer must not divide
    #: it by the accumulation steps again (GRPOTrainer sets the same; stated here because our loss relies on it).
    loss_is_scaled_for_ga = True

    def __init__(
        self,
        model,
        args: ReflectPPOConfig,
        train_dataset: Dataset | None = None,
        processing_class=None,
        reflection_model=None,
        reflection_tokenizer=None,
        peft_config=None,
        callbacks=None,
        eval_dataset: Dataset | None = None,
    ) -> None:
        """``model`` and ``reflection_model``: models, or hub ids / local folders (loaded here with their tokenizers, as
        TRL's trainers take a model id; a reflection that does not learn is loaded frozen, an adapter merged). Without
        ``train_dataset`` the training tasks come from ``args`` (``num_train_tasks`` per stage, or
        ``train_tasks_file``); without ``eval_dataset`` and with an ``eval_strategy``, the evaluation episodes too."""
        model, processing_class, reflection_model, reflection_tokenizer = self._load_players(
            args, model, processing_class, reflection_model, reflection_tokenizer
        )
        if train_dataset is None or (eval_dataset is None and args.eval_strategy != "no"):
            from reflect_trl.trainers.rl_tasks import build_train_tasks, eval_tasks_dataset, tasks_to_dataset

            if train_dataset is None:
                train_dataset = tasks_to_dataset(build_train_tasks(args))
            if eval_dataset is None and args.eval_strategy != "no":
                eval_dataset = eval_tasks_dataset(args)
        # The option labels travel with the policy: those it was trained with, unless the config names the same.
        labels = resolve_option_labels(args.option_labels, local_model_dir(model), "the policy")
        super().__init__(
            model=model,
            reward_funcs=[environment_reward],  # rewards come from the environment (see the function)
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            peft_config=peft_config,
            callbacks=callbacks,
        )
        check_skip_supported(args, self.is_deepspeed_enabled)
        self.option_head = OptionHead(self._tokenizer, labels)
        self.env_class = get_env_class(args.env_name)
        self.tasks = self._task_sampler(train_dataset)
        self.stages = self._stages
        if args.advantage_estimator == "gigpo":
            self._check_state_keys(self.tasks.pools[self.tasks.curriculum.stage][0])
        # Value head (turn-level GAE). A submodule of the policy so DDP/DeepSpeed/optimizer treat it as a parameter.
        self.value_head: nn.Module | None = None
        if args.advantage_estimator == "gae":
            unwrapped = self.accelerator.unwrap_model(self.model)
            head = nn.Linear(unwrapped.config.get_text_config().hidden_size, 1)
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)
            unwrapped.add_module("reflect_value_head", head.to(next(unwrapped.parameters()).device))
            self.value_head = head
        # Reflection player: in this process (hf) or behind an inference server (openai).
        if (
            reflection_model is not None
            and getattr(reflection_model, "hf_device_map", None) is None
            and not getattr(reflection_model, "is_loaded_in_8bit", False)
            and not getattr(reflection_model, "is_loaded_in_4bit", False)
        ):
            reflection_model.to(args.reflection_device or self.accelerator.device)
        self._reflection_model = reflection_model
        self._reflection_tokenizer = reflection_tokenizer
        # The reflection player as a second learner (train_reflection): a submodule of the policy, its own LoRA
        # (when the policy has one) and learning rate.
        self.reflection_learner: ReflectionLearner | None = None
        if args.train_reflection:
            if reflection_model is None:
                raise ValueError("train_reflection needs a reflection model (reflection_model_name_or_path)")
            unwrapped = self.accelerator.unwrap_model(self.model)
            # a policy that continues its SFT adapter brings its own LoRA settings: the reflection gets the same
            # (else all of its weights would train, with a full copy as its reference)
            own_lora = peft_config or (getattr(unwrapped, "peft_config", None) or {}).get("default")
            self.reflection_learner = ReflectionLearner(
                unwrapped, reflection_model, reflection_tokenizer or self._tokenizer, own_lora
            )
            self._reflection_model = self.reflection_learner.model
            if not args.train_policy:
                # no forward runs through the DDP wrapper: the learner averages its own gradients
                self.reflection_learner.average_gradients(self.accelerator)
                mine = {id(p) for p in self.reflection_learner.parameters()}
                for param in self.accelerator.unwrap_model(self.model).parameters():
                    if id(param) not in mine:
                        param.requires_grad_(False)
        # A greedy reflection player generates each distinct prompt once (a pass-through when it samples).
        self.reflection = with_reflection_cache(
            self._reflection_player(args.reflection_temperature), args.reflection_cache_size
        )
        # What the environment's oracle adds to the rollouts: every state's optimal moves (the reflection metrics;
        # the verified reward) and the oracle reflector's text (reflection_objective oracle_sft).
        self._setup_reflection_oracle(self.tasks.pools[self.tasks.curriculum.stage][0])
        rank = self.accelerator.process_index
        self.replay = ReplayBuffer(args.replay_buffer_size or 1, seed=derive_seed(args.seed, "replay", rank))
        # reference tables of turns seen before (the reference is frozen unless sync_ref_model)
        self.ref_memo: RefLogpsMemo | None = None
        if self.beta != 0.0 and args.ref_logps_memo_size > 0 and not args.sync_ref_model:
            self.ref_memo = RefLogpsMemo(args.ref_logps_memo_size)
        self._rollouts = 0
        self._memo_counts = {
            "reflection": (0, 0),
            "ref": (0, 0),
        }  # (hits, lookups) at the last logged rollout
        self._engine: RolloutEngine | None = None
        self._no_signal = NoSignalMonitor()
        use_reflect_progress(self)  # bars on a terminal only; logs with numbers as numbers

    # ------------------------------------------------------------------------------------------------ setup
    @staticmethod
    def _load_players(args: ReflectPPOConfig, model, tokenizer, reflection_model, reflection_tokenizer):
        """The policy and the reflection model (with their tokenizers) of ids or folders given as strings or paths."""
        from reflect_trl.models import load_causal_lm, load_tokenizer

        if isinstance(model, (str, os.PathLike)):
            tokenizer = tokenizer if tokenizer is not None else load_tokenizer(str(model))
            model = load_causal_lm(str(model), trainable=True)
        if isinstance(reflection_model, (str, os.PathLike)):
            if reflection_tokenizer is None:
                reflection_tokenizer = load_tokenizer(str(reflection_model))
            reflection_model = load_causal_lm(
                str(reflection_model),
                dtype=args.reflection_dtype,
                trainable=args.train_reflection,  # a frozen player unless it learns too
                merge_adapter=True,
            )
        return model, tokenizer, reflection_model, reflection_tokenizer

    def _task_sampler(self, train_dataset: Dataset) -> TaskSampler:
        """The training tasks per curriculum stage (from the train dataset) and the curriculum over them."""
        args = self.args
        pools: dict[str, list[Task]] = defaultdict(list)
        for row in train_dataset:
            task = Task.from_dict(json.loads(row["task"]))
            pools[task.difficulty].append(task)
        stages = list(args.curriculum_stages or [s for s in self.env_class.stages if s in pools])
        missing = [s for s in stages if not pools.get(s)]
        if missing:
            raise ValueError(
                f"no training tasks for curriculum stage(s) {missing}; stages with tasks: {sorted(pools)}"
            )
        args.check_stage_schedule(stages)
        self._stages = stages
        if not args.curriculum:
            pools["all"] = [t for s in stages for t in pools[s]]
        curriculum = Curriculum(
            stages=stages if args.curriculum else ["all"],
            schedule=args.curriculum_schedule,
            max_steps=max(args.max_steps, 1),
            stage_starts=args.curriculum_stage_starts if args.curriculum else None,
            threshold=args.curriculum_threshold,
            window=args.curriculum_window,
        )
        return TaskSampler(
            dict(pools), curriculum, derive_seed(args.seed, "tasks", self.accelerator.process_index)
        )

    @property
    def curriculum(self) -> Curriculum:
        return self.tasks.curriculum

    def _check_state_keys(self, task: Task) -> None:
        """gigpo groups turns by ``env.state_key()``: fail now, naming the environment, if it has none."""
        env = make_env(self.args.env_name, **(self.args.env_kwargs or {}))
        env.reset(task=task)
        try:
            env.state_key()
        except NotImplementedError as err:
            raise ValueError(f"advantage_estimator='gigpo': {err}") from None

    def _reflection_player(self, temperature: float) -> ReflectionPlayer | None:
        """A player of the reflection model at ``temperature`` (None when the run has no reflection)."""
        args = self.args
        if args.reflection_backend == "openai":
            return make_reflection_player(
                "openai",
                tokenizer=self._reflection_tokenizer,
                max_new_tokens=args.reflection_max_new_tokens,
                temperature=temperature,
                seed=derive_seed(args.seed, "reflection", self.accelerator.process_index),
                **args.reflection_server_settings(),
            )
        if self._reflection_model is None:
            return None
        learning = self.reflection_learner is not None
        return make_reflection_player(
            "hf",
            model=self._reflection_model,
            tokenizer=self._reflection_tokenizer or self._tokenizer,
            max_new_tokens=args.reflection_max_new_tokens,
            temperature=temperature,
            # a trained player keeps its gradients and mode (the rollout switches the policy, its parent, to eval)
            # and returns its tokens and their sampling log-probs
            freeze=not learning,
            record_tokens=learning and temperature > 0,
        )

    # --------------------------------------------------------------------------------------------- rollouts
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """One rollout batch: play episodes, turn every turn into a row with its advantage, score old and reference
        log-probs. One row per turn (padded rows have ``turn_mask`` 0); see :func:`rl_batch.collate` for the keys,
        plus ``old_logps``, ``ref_log_probs`` (``beta`` > 0) and the 0-d ``stage_index``."""
        if self.curriculum.schedule == "steps":
            self._advance_curriculum()
        stage, k = self.curriculum.stage, self.num_generations
        n_tasks = max(len(inputs) // k, 1)
        task_state = self.tasks.state_dict()
        tasks = [t for t in self.tasks.draw(n_tasks) for _ in range(k)]
        groups = [g for g in range(n_tasks) for _ in range(k)]
        start = time.perf_counter()
        episodes = self._play(tasks, groups, task_state)
        rollout_seconds = time.perf_counter() - start

        rows = self._episode_rows(episodes)
        replayed = self._replay(episodes)
        self._log_signal(stage, episodes, [r.advantage for r in rows], [r.advantage for r in replayed])
        rows += replayed
        n_real = len(rows)
        # every process pads to the same multiple of steps_per_generation (GRPO's split and the collectives)
        target = int(self.accelerator.gather(torch.tensor([n_real], device=self.accelerator.device)).max())
        rows = rl_batch.pad_rows(rows, target, self.args.steps_per_generation)
        batch = rl_batch.collate(rows, self._tokenizer.pad_token_id, self.accelerator.device)
        batch["stage_index"] = torch.tensor(
            float(self.curriculum.stage_index), device=self.accelerator.device
        )
        with torch.no_grad():
            self._add_old_and_reference_logps(batch)
        self._log_rollout(stage, episodes, rollout_seconds, n_real)
        self._rollouts += 1
        return batch

    def _play(self, tasks: list[Task], groups: list[int], task_state: dict[str, Any]) -> list[Episode]:
        """The rollout's episodes, with the policy in eval mode. The episodes of one task share their environment
        seed (e.g. AutoExplore's leave-out), so a group compares the policy's choices on one problem instance."""
        rank = self.accelerator.process_index
        seeds = [derive_seed(self.args.seed, rank, self._rollouts, g) for g in groups]
        failure: ReflectionServerError | None = None
        with unwrap_model_for_generation(
            self.model_wrapped, self.accelerator, gather_deepspeed3_params=self.args.ds3_gather_for_generation
        ) as unwrapped:
            was_training = unwrapped.training
            unwrapped.eval()
            try:
                episodes = self._rollout_engine(unwrapped).run(tasks, seeds, groups)
            except ReflectionServerError as err:
                failure = err
            unwrapped.train(was_training)
        if self.args.reflection_backend == "openai":
            self._stop_on_server_failure(failure, task_state)
        return episodes

    def _rollout_engine(self, model) -> RolloutEngine:
        value_fn = None
        if self.value_head is not None:
            head = self.value_head

            def value_fn(hidden: torch.Tensor) -> torch.Tensor:
                return head(hidden.float())

        actor = PolicyActor(
            model,
            self._tokenizer,
            self.option_head,
            self.temperature,
            value_fn=value_fn,
            shared_prefix_min_tokens=self.args.shared_prefix_min_tokens,
        )
        if self._engine is None:
            self._engine = RolloutEngine(
                self.args.env_name,
                actor,
                self.reflection,
                env_kwargs=self.args.env_kwargs,
                shuffle_options=self.args.shuffle_options,
                max_prompt_length=self.args.max_prompt_length,
                record_state_keys=self._state_keys
                and (self.args.advantage_estimator == "gigpo" or self.args.reflection_reward != "advantage"),
                record_optimal_actions=self._records_optimal,
                teacher=self._teacher,
            )
        self._engine.policy = actor
        return self._engine

    def _episode_rows(self, episodes: list[Episode]) -> list[rl_batch.TurnRow]:
        """Every turn as a row with its finalised advantage (``rl_math`` sections 1 and 2)."""
        args = self.args
        estimated = rl_math.episode_advantages(
            args.advantage_estimator,
            [[t.reward for t in ep.turns] for ep in episodes],
            [ep.group for ep in episodes],
            gamma=args.gamma,
            state_keys=[[t.state_key for t in ep.turns] for ep in episodes],
            values=[[t.value or 0.0 for t in ep.turns] for ep in episodes],
            gae_lambda=args.gae_lambda,
            reinforce_baseline=args.reinforce_baseline,
            step_weight=args.step_advantage_weight,
            scale=args.scale_rewards,
            std_floor=args.scale_std_floor,
        )
        if estimated.step_groups is not None:
            metrics = self._metrics["train"]
            metrics["gigpo/grouped_turn_share"].append(estimated.step_groups.grouped_share)
            metrics["gigpo/mean_step_group_size"].append(estimated.step_groups.mean_group_size)
            metrics["gigpo/step_advantage_std"].append(estimated.step_groups.step_advantage_std)
        rows = rl_batch.episode_rows(episodes, estimated.advantages, estimated.value_targets)
        advantages = rl_math.finalize_advantages([r.advantage for r in rows], args.whiten_advantages)
        rows = rl_batch.with_advantages(rows, advantages)
        return self._with_reflection_targets(rows, episodes, advantages)

    def _replay(self, episodes: list[Episode]) -> list[rl_batch.TurnRow]:
        """The paper's self-imitation replay: stored successful turns join the batch with the constant advantage
        ``replay_weight`` (sampled before this rollout's successes are stored)."""
        if self.args.replay_buffer_size <= 0:
            return []
        rows = rl_batch.replay_rows(self.replay.sample(self.args.replay_samples), self.args.replay_weight)
        for ep in episodes:
            if ep.success:
                returns = rl_math.returns_to_go([t.reward for t in ep.turns], self.args.gamma)
                self.replay.add(
                    [
                        ReplayTurn(tuple(t.prompt_ids), t.option, t.num_options, g)
                        for t, g in zip(ep.turns, returns, strict=True)
                    ]
                )
        return rows

    def _add_old_and_reference_logps(self, batch: dict[str, Any]) -> None:
        """``old_logps``: pi_old(a|s) of a sampled turn is the log-prob the rollout drew it with (same weights, another
        batching: equal up to float rounding); stored turns (replay: NaN) are scored. ``ref_log_probs`` (beta > 0):
        the reference's option table, from the memo for turns seen before."""
        sampling = batch["sampling_logps"]
        stored = torch.isnan(sampling)
        if stored.any():
            tables = self._option_tables(self.model, batch, stored)
            chosen = tables.gather(-1, batch["option"][stored][:, None]).squeeze(-1)
            sampling = sampling.clone().masked_scatter(stored, chosen.to(sampling.dtype))
        batch["old_logps"] = sampling
        if self.beta != 0.0 and self.args.train_policy:
            batch["ref_log_probs"] = self._reference_tables(batch)
        if (
            self.reflection_learner is not None
            and self.args.reflection_beta != 0.0
            and "reflection_ids" in batch
        ):
            batch["ref_reflection_logps"] = self.reflection_learner.reference_logps(
                batch, self.args.reflection_temperature
            )

    def _reference_tables(self, batch: dict[str, Any]) -> torch.Tensor:
        """log pi_ref(. | s) of every row: the memo for turns scored before (``ref_logps_memo_size``), else one forward
        of the reference (the frozen copy, or the policy with its adapter off / on the ``ref`` adapter)."""
        n_rows, n_labels = batch["option"].shape[0], self.option_head.num_labels
        tables = torch.full((n_rows, n_labels), float("-inf"), device=batch["option"].device)
        need = torch.ones(n_rows, dtype=torch.bool, device=tables.device)
        keys: dict[int, bytes] = {}
        if self.ref_memo is not None:
            sequences = unpad_left(batch["prompt_ids"], batch["prompt_mask"])
            offered = batch["num_options"].tolist()
            for i in range(n_rows):
                keys[i] = turn_key(sequences[i], offered[i])
                known = self.ref_memo.get(keys[i])
                if known is not None:
                    tables[i, : offered[i]] = known.to(tables.device)
                    need[i] = False
        if need.any():
            if self.ref_model is not None:
                scored = self._option_tables(self.ref_model, batch, need)
            else:
                unwrapped = self.accelerator.unwrap_model(self.model)
                with use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None):
                    scored = self._option_tables(self.model, batch, need)
            tables[need] = scored.to(tables.dtype)
            if self.ref_memo is not None:
                offered = batch["num_options"].tolist()
                for i in need.nonzero().flatten().tolist():
                    self.ref_memo.put(keys[i], tables[i, : offered[i]])
        return tables

    def _stop_on_server_failure(
        self, failure: ReflectionServerError | None, task_state: dict[str, Any]
    ) -> None:
        """If the reflection server failed on any process, every process writes the checkpoint of the last finished
        step (as if this rollout had not started) and the run ends with an error naming the URL and the checkpoint."""
        failed = torch.tensor(0.0 if failure is None else 1.0, device=self.accelerator.device)
        if self.accelerator.reduce(failed, reduction="sum").item() == 0:
            return
        self.tasks.load_state_dict(task_state)
        self._save_checkpoint(self.model, trial=None)
        checkpoint = (
            Path(self._get_output_dir(trial=None)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        )
        where = f"{failure} " if failure is not None else "(on another process) "
        raise ReflectionServerError(
            f"reflection server failed at global step {self.state.global_step}: {where}-- the state after the last "
            f"finished step is saved in {checkpoint}; restart the server and resume with "
            f"--resume_from_checkpoint {checkpoint}",
            url=getattr(failure, "url", None) or self.args.reflection_base_url,
        ) from failure

    def _advance_curriculum(self, successes: list[bool] | None = None) -> None:
        """Step schedule: promote before drawing the rollout's tasks; success schedule: after seeing outcomes."""
        if self.curriculum.update(self.state.global_step, successes or []):
            self.replay.clear()  # stages are sequential, as in the paper

    # -------------------------------------------------------------------------------------- micro-batches
    def _prepare_inputs(
        self, generation_batch: dict[str, torch.Tensor | Any]
    ) -> dict[str, torch.Tensor | Any]:
        """GRPO's buffering (generate once per ``steps_per_generation * num_iterations`` micro-steps, shuffle, split
        into ``steps_per_generation`` micro-batches), plus the loss normaliser of every micro-batch: the number of
        real turns of its gradient-accumulation window on all processes, and how many of them carry an advantage."""
        previous = self._buffered_inputs
        inputs = super()._prepare_inputs(generation_batch)
        if self._buffered_inputs is not previous:  # a new rollout batch was just split into micro-batches
            ga = self.args.gradient_accumulation_steps  # divides steps_per_generation (ReflectPPOConfig)
            chunks = self._buffered_inputs
            windows = [chunks[i : i + ga] for i in range(0, len(chunks), ga)]
            totals = self.accelerator.reduce(
                rl_batch.window_counts(windows), reduction="sum"
            )  # one collective
            for window, (turns, value_turns, signal_turns) in zip(windows, totals, strict=True):
                for chunk in window:
                    chunk["window_turns"], chunk["window_value_turns"] = turns, value_turns
                    chunk["window_signal_turns"] = signal_turns
        return inputs

    # ------------------------------------------------------------------------------------------- the loss
    def _option_scores(self, model, batch: dict[str, Any], rows: torch.Tensor | None = None) -> OptionForward:
        """:func:`reflect_trl.action_head.option_forward` of ``model`` over the batch's turn prompts (those of
        ``rows``), under autocast, with the value head's hidden state for ``gae`` and the MoE router loss. The shared
        prompt prefix is encoded once unless activation checkpointing (which drops the cache) or a router loss (which
        would miss the prefix tokens) forbids it."""
        ids, mask, offered = batch["prompt_ids"], batch["prompt_mask"], batch["num_options"]
        if rows is not None:
            ids, mask, offered = ids[rows], mask[rows], offered[rows]
        prefix = self.args.shared_prefix_min_tokens
        if self.aux_loss_enabled or checkpointing_drops_cache(
            self.args, self.accelerator.unwrap_model(model)
        ):
            prefix = 0
        extra = {"output_router_logits": True} if self.aux_loss_enabled else {}
        with self.accelerator.autocast():
            return self.option_head.forward(
                model,
                unpad_left(ids, mask),
                offered,
                temperature=self.temperature,
                shared_prefix_min_tokens=prefix,
                output_hidden_states=self.value_head is not None,
                **extra,
            )

    def _option_tables(self, model, batch: dict[str, Any], rows: torch.Tensor) -> torch.Tensor:
        """The option tables of the rows ``rows`` (a bool mask), in micro-batches of ``per_device_train_batch_size``."""
        index = rows.nonzero().flatten()
        size = self.args.per_device_train_batch_size
        tables = []
        for start in range(0, index.numel(), size):
            chunk = torch.zeros_like(rows)
            chunk[index[start : start + size]] = True
            tables.append(self._option_scores(model, batch, chunk).log_probs)
        return torch.cat(tables)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The objective of ``rl_math`` (section 3) for one micro-batch: each term is its share of the window mean
        (``rl_math.window_mean``) over the real turns of the accumulation window on all processes.
        ``num_items_in_batch`` (the Trainer's token count) is not used."""
        if return_outputs:
            raise ValueError("ReflectPPOTrainer does not return outputs")
        loss = torch.zeros((), device=self.accelerator.device)
        if self.args.train_policy:
            loss = loss + self._policy_loss(model, inputs)
        if self.reflection_learner is not None and "teacher_ids" in inputs:
            loss = loss + self._reflection_sft_loss(inputs)
        elif self.reflection_learner is not None and "reflection_ids" in inputs:
            loss = loss + self._reflection_loss(inputs)
        # skip_no_signal_steps: a window without advantage gets a zero loss and no optimizer / scheduler step
        loss = self._skip_without_signal(loss, inputs)
        # Stop every process together on a non-finite loss (a lone raise would hang the others in all-reduce).
        bad = torch.tensor(0.0 if torch.isfinite(loss).all() else 1.0, device=loss.device)
        if self.accelerator.reduce(bad, reduction="sum").item() > 0:
            raise FloatingPointError(
                f"non-finite loss ({loss.item()}) at global step {self.state.global_step} "
                f"(curriculum stage {self.curriculum.stage!r}); lower the learning rate or check the rewards"
            )
        return loss

    def _policy_loss(self, model, inputs) -> torch.Tensor:
        """The policy's terms of ``rl_math`` section 3, each a window mean."""
        args, world = self.args, self.accelerator.num_processes
        scores = self._option_scores(model, inputs)
        values = None
        if self.value_head is not None:  # detached: only the head learns from the value loss
            values = self.value_head(scores.hidden.detach().float()).squeeze(-1)
        terms = rl_math.turn_losses(
            scores.log_probs,
            inputs["option"],
            inputs["old_logps"],
            inputs["advantages"],
            clip_low=self.epsilon_low,
            clip_high=self.epsilon_high,
            ref_log_probs=inputs.get("ref_log_probs") if self.beta != 0.0 else None,
            values=values,
            old_values=inputs["old_values"],
            returns=inputs["returns"],
            value_clip=args.value_clip,
        )
        mask = inputs["turn_mask"]
        per_turn = terms.policy - args.entropy_coef * terms.entropy
        if terms.kl is not None:
            per_turn = per_turn + self.beta * terms.kl
        loss = rl_math.window_mean(per_turn, mask, inputs["window_turns"], world)
        if terms.value is not None:
            value_mask = inputs["value_mask"] * mask
            loss = loss + args.vf_coef * rl_math.window_mean(
                terms.value, value_mask, inputs["window_value_turns"], world
            )
        if scores.aux_loss is not None:
            loss = (
                loss + self.router_aux_loss_coef * scores.aux_loss / self.current_gradient_accumulation_steps
            )
        self._log_loss_metrics(inputs, scores, terms, values)
        return loss

    def _reflection_loss(self, inputs) -> torch.Tensor:
        """The reflection player's terms of ``rl_math`` section 4 over the turns that read a sampled reflection,
        normalised by the same window count as the policy's turns."""
        args = self.args
        terms, entropy = self.reflection_learner.losses(
            inputs, args.reflection_temperature, self.epsilon_low, self.epsilon_high, args.reflection_beta
        )
        mask = inputs["turn_mask"] * (inputs["reflection_token_mask"].sum(-1) > 0).float()
        per_turn = terms.policy + (args.reflection_beta * terms.kl if terms.kl is not None else 0.0)
        loss = rl_math.window_mean(per_turn, mask, inputs["window_turns"], self.accelerator.num_processes)
        columns = {"policy_loss": terms.policy, "entropy": entropy, "clip_fraction": terms.clipped}
        columns["ratio_mean"] = terms.ratio
        if terms.kl is not None:
            columns["kl"] = terms.kl
        self._log_means({f"reflection/{k}": (v, mask) for k, v in columns.items()})
        return loss

    def create_model_card(
        self,
        model_name: str | None = None,
        dataset_name: str | None = None,
        tags: str | list[str] | None = None,
    ) -> None:
        """A Reflect-RL card (:mod:`reflect_trl.trainers.model_card`): base model, environment, reflection model,
        paper, how to act with the policy, rollout success per curriculum stage."""
        if not self.is_world_process_zero():
            return
        from reflect_trl.trainers.model_card import rl_card_facts, write_model_card

        write_model_card(rl_card_facts(self, model_name, tags), self.args.output_dir)


__all__ = ["ReflectPPOConfig", "ReflectPPOTrainer"]
