"""A tiny RL run on AutoExplore depth-1 tasks executes end to end (example repository, tiny models)."""

from __future__ import annotations

import pytest

from reflect_trl.envs import make_env
from reflect_trl.envs.auto_explore.example_repo import write_example_repo
from reflect_trl.models import load_causal_lm, load_tokenizer
from reflect_trl.tiny_models import build_tiny_model
from reflect_trl.trainers.rl_config import ReflectPPOConfig
from reflect_trl.trainers.rl_tasks import build_train_tasks, eval_tasks_dataset, tasks_to_dataset
from reflect_trl.trainers.rl_trainer import ReflectPPOTrainer


@pytest.fixture(scope="module")
def explore_setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    repo = write_example_repo(root)
    env_kwargs = {"roots": [str(repo)], "horizon": 6, "max_content_tokens": 30}
    env = make_env("auto_explore", **env_kwargs)
    texts = []
    for task in env.make_tasks("train", 6, seed=0, difficulty="depth1"):
        obs = env.reset(task=task)
        texts.append(obs.text + "\n" + "\n".join(obs.actions))
    model_dir = build_tiny_model(tmp_path_factory.mktemp("tiny-ae"), preset="nano", texts=texts)
    return str(model_dir), env_kwargs


def test_rl_on_depth1_tasks_runs_end_to_end(explore_setup, tmp_path):
    model_dir, env_kwargs = explore_setup
    args = ReflectPPOConfig(
        output_dir=str(tmp_path),
        env_name="auto_explore",
        env_kwargs=env_kwargs,
        curriculum_stages=["depth1"],
        num_train_tasks=4,
        per_device_train_batch_size=4,
        num_generations=2,
        max_steps=2,
        learning_rate=1e-3,
        reflection_max_new_tokens=4,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
    )
    tasks = build_train_tasks(args)
    assert tasks and all(t.difficulty == "depth1" for t in tasks)
    trainer = ReflectPPOTrainer(
        model=load_causal_lm(model_dir),
        args=args,
        train_dataset=tasks_to_dataset(tasks),
        processing_class=load_tokenizer(model_dir),
        reflection_model=load_causal_lm(model_dir, trainable=False),
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "env/success_rate" in h]
    assert len(logs) == 2
    assert all(0.0 <= h["env/success_rate"] <= 1.0 and h["env/episode_length"] >= 1 for h in logs)
    assert all("stage/depth1/success_rate" in h for h in logs)


def test_evaluation_during_training_plays_without_the_training_only_leave_out(explore_setup, tmp_path):
    """``leaveout_prob`` hides directory entries except those on the way to the target: a training augmentation that
    would tell an evaluation where the target is. The evaluation environments leave it out (unless eval_env_kwargs
    says otherwise), so the evaluation prompts list every entry."""
    model_dir, env_kwargs = explore_setup
    args = ReflectPPOConfig(
        output_dir=str(tmp_path), env_name="auto_explore", env_kwargs={**env_kwargs, "leaveout_prob": 0.9},
        curriculum_stages=["depth1"], num_train_tasks=4, per_device_train_batch_size=4, num_generations=2,
        max_steps=2, eval_strategy="steps", eval_steps=1, eval_episodes_per_stage=2, use_cpu=True, bf16=False,
        report_to="none", save_strategy="no",
    )  # fmt: skip
    assert args.evaluation_env_kwargs == env_kwargs
    explicit = ReflectPPOConfig(
        output_dir=str(tmp_path),
        env_name="auto_explore",
        eval_env_kwargs={"horizon": 3},
        use_cpu=True,
        bf16=False,
    )
    assert explicit.evaluation_env_kwargs == {"horizon": 3}
    trainer = ReflectPPOTrainer(
        model=load_causal_lm(model_dir),
        args=args,
        train_dataset=tasks_to_dataset(build_train_tasks(args)),
        eval_dataset=eval_tasks_dataset(args),
        processing_class=load_tokenizer(model_dir),
    )
    engine = trainer._evaluation_engine(trainer.model)
    assert engine.env_kwargs == env_kwargs and "leaveout_prob" not in engine.env_kwargs
    task = build_train_tasks(args)[0]
    seen = {i: engine._env(0).reset(seed=i, task=task).actions for i in range(3)}
    full = make_env("auto_explore", **env_kwargs).reset(seed=0, task=task).actions
    assert all(actions == full for actions in seen.values())
    leaky = make_env("auto_explore", **args.env_kwargs)
    assert any(len(leaky.reset(seed=i, task=task).actions) < len(full) for i in range(5)), (
        "training hides entries"
    )
