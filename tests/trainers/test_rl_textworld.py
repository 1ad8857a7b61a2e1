"""A few RL steps on a generated TextWorld game with the tiny models (needs the [textworld] extra)."""

from __future__ import annotations

import pytest

pytest.importorskip("textworld")

from reflect_trl.envs import make_env  # noqa: E402
from reflect_trl.models import load_causal_lm, load_tokenizer  # noqa: E402
from reflect_trl.tiny_models import build_tiny_model  # noqa: E402
from reflect_trl.trainers.rl_config import ReflectPPOConfig  # noqa: E402
from reflect_trl.trainers.rl_tasks import build_train_tasks, tasks_to_dataset  # noqa: E402
from reflect_trl.trainers.rl_trainer import ReflectPPOTrainer  # noqa: E402


@pytest.mark.textworld
def test_rl_steps_on_textworld(tmp_path):
    env_kwargs = {
        "challenge": "custom",
        "horizon": 6,
        "cache_dir": str(tmp_path / "games"),
        "exclude_commands": ["examine"],
    }
    env = make_env("textworld", **env_kwargs)
    tasks = env.make_tasks("train", 2, seed=0, difficulty="easy")
    texts = []
    for task in tasks:
        obs = env.reset(task=task)
        texts.append(obs.text + "\n" + "\n".join(obs.actions))
    model_dir = str(build_tiny_model(tmp_path / "tiny", preset="nano", texts=texts))
    args = ReflectPPOConfig(
        output_dir=str(tmp_path / "rl"),
        env_name="textworld",
        env_kwargs=env_kwargs,
        curriculum_stages=["easy"],
        num_train_tasks=2,
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
    trainer = ReflectPPOTrainer(
        model=load_causal_lm(model_dir),
        args=args,
        train_dataset=tasks_to_dataset(build_train_tasks(args)),
        processing_class=load_tokenizer(model_dir),
        reflection_model=load_causal_lm(model_dir, trainable=False),
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "env/success_rate" in h]
    assert len(logs) == 2 and all(h["env/episode_length"] >= 1 for h in logs)
