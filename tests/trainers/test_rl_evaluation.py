"""Evaluation during RL training: greedy episodes on held-out tasks through TrainingArguments' eval machinery."""

from __future__ import annotations

import json

import pytest
import torch
from test_rl import _trainer as rl_trainer

from reflect_trl.envs import Task
from reflect_trl.evaluation import EvalConfiguration, EvalSettings, evaluate
from reflect_trl.models import load_causal_lm
from reflect_trl.trainers.rl_config import ReflectPPOConfig
from reflect_trl.trainers.rl_tasks import eval_tasks_dataset
from reflect_trl.trainers.rl_trainer import ReflectPPOTrainer

STAGES = ("pickup", "dropoff", "full")
EPISODES = 4  # per stage


def _trainer(model_dir, out_dir, **overrides) -> ReflectPPOTrainer:
    """test_rl's tiny trainer, training its reflections sampled (the evaluation must read them greedily)."""
    settings = dict(
        learning_rate=3e-3,
        reflection_temperature=1.0,
        log_episodes_every=0,
        eval_episodes_per_stage=EPISODES,
    )
    return rl_trainer(model_dir, out_dir, **{**settings, **overrides})


def _best_model_run(model_dir, out_dir, **overrides) -> ReflectPPOTrainer:
    """3 steps, evaluated and saved after each, keeping the best model by the greedy episode length (the untrained
    tiny policy succeeds nowhere; its episode lengths do differ from step to step)."""
    trainer = _trainer(
        model_dir,
        out_dir,
        max_steps=3,
        eval_strategy="steps",
        eval_steps=1,
        save_strategy="steps",
        save_steps=1,
        load_best_model_at_end=True,
        metric_for_best_model="episode_length",
        **overrides,
    )
    trainer.train()
    return trainer


def _evaluations(trainer) -> list[dict]:
    return [h for h in trainer.state.log_history if "eval_success_rate" in h]


def test_eval_tasks_are_those_of_reflect_trl_eval():
    from reflect_trl.evaluation import eval_tasks

    args = ReflectPPOConfig(output_dir="unused", use_cpu=True, eval_episodes_per_stage=3, eval_seed=5)
    rows = eval_tasks_dataset(args)
    settings = EvalSettings(split="validation", episodes_per_stage=3, seed=5)
    expected = [eval_tasks(settings, s) for s in STAGES]
    assert rows["episode_seed"] == [seed for _, seeds in expected for seed in seeds]
    assert [Task.from_dict(json.loads(r)) for r in rows["task"]] == [
        t for tasks, _ in expected for t in tasks
    ]


def test_evaluation_during_training_is_reflect_trl_eval_of_the_checkpoint(tiny_model_dir, tmp_path):
    trainer = _trainer(
        tiny_model_dir,
        tmp_path / "run",
        eval_strategy="steps",
        eval_steps=2,
        eval_on_start=True,
        save_strategy="steps",
        save_steps=2,
    )
    trainer.train()
    evals = _evaluations(trainer)
    assert [h["step"] for h in evals] == [0, 2, 4]  # the SFT start, then every eval_steps
    for h in evals:
        assert {f"eval_{s}_success_rate" for s in STAGES} <= set(h)
        assert {"eval_crash_rate", "eval_episode_length", "eval_runtime"} <= set(h)
        rates = [h[f"eval_{s}_success_rate"] for s in STAGES]
        assert h["eval_success_rate"] == pytest.approx(sum(rates) / 3)
        assert h["eval_episode_length"] >= 1
    # the logged training metrics are those of training rollouts only (not merged with the evaluation)
    assert all("env/success_rate" not in h for h in evals)

    # what `reflect-trl eval` gives the checkpoint of step 2 and the final model, greedy, same split/seed/episodes
    trainer.save_model(str(tmp_path / "final"))
    settings = EvalSettings(
        split="validation",
        seed=777,
        episodes_per_stage=EPISODES,
        decodings=["greedy"],
        reflection_max_new_tokens=6,
    )
    for policy, logged in ((tmp_path / "run" / "checkpoint-2", evals[1]), (tmp_path / "final", evals[2])):
        report = evaluate([EvalConfiguration("p", str(policy), tiny_model_dir)], settings)
        cells = {r.stage: r for r in report.results}
        for s in STAGES:
            assert cells[s].success_rate == pytest.approx(logged[f"eval_{s}_success_rate"]), (policy, s)
        mean_length = sum(r.mean_length for r in report.results) / len(STAGES)
        crash_rate = sum(r.crash_rate for r in report.results) / len(STAGES)
        assert logged["eval_episode_length"] == pytest.approx(mean_length)
        assert logged["eval_crash_rate"] == pytest.approx(crash_rate)


def test_evaluating_does_not_change_the_run(tiny_model_dir, tmp_path):
    plain = _trainer(tiny_model_dir, tmp_path / "plain")
    plain.train()
    evaluated = _trainer(tiny_model_dir, tmp_path / "evaluated", eval_strategy="steps", eval_steps=1)
    evaluated.train()
    assert len(_evaluations(evaluated)) == 4

    def train_logs(trainer):
        return [
            (h["step"], h["loss"], h.get("env/success_rate"), h.get("entropy"))
            for h in trainer.state.log_history
            if "loss" in h
        ]

    assert train_logs(evaluated) == train_logs(plain)
    for (name, a), (_, b) in zip(
        plain.model.named_parameters(), evaluated.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name


def test_load_best_model_at_end_restores_the_best_evaluated_checkpoint(tiny_model_dir, tmp_path):
    trainer = _best_model_run(tiny_model_dir, tmp_path / "run")
    evals = _evaluations(trainer)
    assert len({h["eval_episode_length"] for h in evals}) > 1
    best = max(evals, key=lambda h: (h["eval_episode_length"], -h["step"]))  # the first of the longest
    assert trainer.state.best_global_step == best["step"]
    assert trainer.state.best_model_checkpoint == str(tmp_path / "run" / f"checkpoint-{best['step']}")
    saved = load_causal_lm(str(tmp_path / "run" / f"checkpoint-{best['step']}"))
    for (name, a), (_, b) in zip(saved.named_parameters(), trainer.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_load_best_model_at_end_can_keep_the_evaluated_start(tiny_model_dir, tmp_path):
    """With eval_on_start the policy before RL competes too (Trainer alone only records checkpoints of steps > 0).
    Here the untrained policy's greedy episodes are (among) the longest, and a tie keeps the earlier step."""
    trainer = _best_model_run(tiny_model_dir, tmp_path / "run", eval_on_start=True)
    lengths = {h["step"]: h["eval_episode_length"] for h in _evaluations(trainer)}
    assert list(lengths) == [0, 1, 2, 3]
    assert lengths[0] >= max(lengths.values()) > min(lengths.values()), lengths
    assert trainer.state.best_model_checkpoint == str(tmp_path / "run" / "checkpoint-0")
    start = load_causal_lm(tiny_model_dir)
    moved = load_causal_lm(str(tmp_path / "run" / "checkpoint-3"))
    assert any(not torch.equal(a, b) for a, b in zip(start.parameters(), moved.parameters(), strict=True))
    for (name, a), (_, b) in zip(start.named_parameters(), trainer.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_config_checks_the_evaluation_fields():
    args = ReflectPPOConfig(
        output_dir="unused",
        use_cpu=True,
        eval_strategy="steps",
        save_strategy="steps",
        load_best_model_at_end=True,
    )
    # not TrainingArguments' "loss", which this evaluation does not compute
    assert args.metric_for_best_model == "success_rate" and args.greater_is_better
    # one greedy episode per evaluation task: any group size trains with evaluations (GRPO's eval batch check)
    ReflectPPOConfig(
        output_dir="unused",
        use_cpu=True,
        num_generations=3,
        per_device_train_batch_size=6,
        eval_strategy="steps",
    )
    with pytest.raises(ValueError, match="eval_episodes_per_stage must be >= 1, got 0"):
        ReflectPPOConfig(output_dir="unused", use_cpu=True, eval_episodes_per_stage=0)
    with pytest.raises(
        ValueError, match=r"eval_split='dev'; choose one of \('train', 'validation', 'test'\)"
    ):
        ReflectPPOConfig(output_dir="unused", use_cpu=True, eval_split="dev")


def test_rl_command_evaluates_during_training(tiny_model_dir, tmp_path):
    from reflect_trl.cli import main

    out = tmp_path / "rl"
    argv = ["rl", "--model_name_or_path", tiny_model_dir, "--reflection_model_name_or_path", tiny_model_dir]
    argv += ["--output_dir", str(out)]
    flags = {
        "--bf16": "false",
        "--report_to": "none",
        "--max_steps": "3",
        "--per_device_train_batch_size": "8",
        "--reflection_max_new_tokens": "6",
        "--num_train_tasks": "4",
        "--save_strategy": "no",
        "--eval_strategy": "steps",
        "--eval_steps": "1",
        "--eval_episodes_per_stage": "2",
    }
    argv += ["--use_cpu", *(x for item in flags.items() for x in item)]
    assert main(argv) == 0
    history = json.loads((out / "log_history.json").read_text())
    evals = [h for h in history if "eval_success_rate" in h]
    assert [h["step"] for h in evals] == [1, 2, 3]
    assert all(f"eval_{s}_success_rate" in h for h in evals for s in STAGES)
