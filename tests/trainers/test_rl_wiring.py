"""The rollout -> rows -> advantages -> loss path on hand-built episodes: each advantage lands on its own turn's row,
every estimator pushes a good option up and a bad one down, and gradient accumulation does not change the gradient.

The episodes are played by hand (``ReflectPPOTrainer._play`` replaced): real DangerousTaxi prompts, chosen options
and rewards we set, so the expected advantages can be written down."""

from __future__ import annotations

import pytest
import torch
from test_rl_loss import make_trainer

from reflect_trl.envs import make_env
from reflect_trl.models import load_tokenizer
from reflect_trl.prompts import build_prompt, encode_prompts
from reflect_trl.rollout import Episode, Turn
from reflect_trl.trainers import rl_batch
from reflect_trl.trainers.rl_trainer import ReflectPPOTrainer


def _trainer(model_dir, out_dir, **overrides) -> ReflectPPOTrainer:
    return make_trainer(model_dir, out_dir, **{"logging_steps": 1, **overrides})


def _prompts(tokenizer, n: int) -> list[tuple[list[int], int]]:
    """``n`` distinct real turn prompts (token ids) and their number of offered options."""
    env = make_env("taxi")
    out = []
    for task in env.make_tasks("train", n, seed=3, difficulty="full"):
        obs = env.reset(task=task)
        out.append(
            (encode_prompts(tokenizer, [build_prompt(obs.text, obs.actions).text])[0], len(obs.actions))
        )
    return out


def _episode(task, group: int, turns: list[tuple[list[int], int, int, float, str]]) -> Episode:
    """An episode of (prompt ids, offered options, chosen option, reward, state key) turns."""
    ep = Episode(task=task, seed=0, group=group)
    for step, (ids, offered, option, reward, key) in enumerate(turns):
        ep.turns.append(
            Turn(
                step,
                "s",
                ("a",) * offered,
                None,
                ids,
                offered,
                option,
                option,
                -1.5,
                0.5,
                reward=reward,
                state_key=key,
            )
        )
    ep.success = turns[-1][3] > 0
    return ep


def test_every_advantage_lands_on_its_own_turn(tiny_model_dir, tmp_path):
    """Two tasks x two episodes of different lengths, rloo, no whitening: the batch row of each (prompt, option)
    carries the hand-computed leave-one-out advantage of its episode, and padding rows carry none."""
    trainer = _trainer(
        tiny_model_dir, tmp_path, advantage_estimator="rloo", whiten_advantages=False, gamma=1.0
    )
    (p0, n0), (p1, n1), (p2, n2), (p3, n3), (p4, n4) = _prompts(trainer._tokenizer, 5)
    task = trainer.tasks.pools["pickup"][0]
    episodes = [
        _episode(task, 0, [(p0, n0, 1, 0.0, "a"), (p1, n1, 2, 1.0, "b")]),  # R = 1
        _episode(task, 0, [(p0, n0, 3, -0.5, "a")]),  # R = -0.5
        _episode(task, 1, [(p2, n2, 0, 0.25, "c")]),  # R = 0.25
        _episode(task, 1, [(p3, n3, 4, 0.0, "d"), (p4, n4, 5, -0.5, "e")]),  # R = -0.5
    ]
    # leave-one-out over the other episode's return, the same advantage on every turn of an episode
    expected = {
        (0, 1): 1.0 + 0.5,
        (1, 2): 1.0 + 0.5,
        (0, 3): -0.5 - 1.0,
        (2, 0): 0.25 + 0.5,
        (3, 4): -0.5 - 0.25,
        (4, 5): -0.5 - 0.25,
    }
    trainer._play = lambda tasks, groups, state: episodes
    trainer.model.train()
    batch = trainer._generate_and_score_completions([{}] * 4)
    prompts = {tuple(p): k for k, p in enumerate((p0, p1, p2, p3, p4))}
    real = batch["turn_mask"].bool()
    seen = {}
    for row in real.nonzero().flatten().tolist():
        ids = batch["prompt_ids"][row][batch["prompt_mask"][row].bool()].tolist()
        seen[(prompts[tuple(ids)], int(batch["option"][row]))] = batch["advantages"][row].item()
    assert seen == pytest.approx(expected)
    assert batch["advantages"][~real].eq(0).all()
    assert int(real.sum()) == 6 and batch["prompt_ids"].shape[0] % trainer.args.steps_per_generation == 0


@pytest.mark.parametrize("estimator", ["reinforce", "rloo", "gae", "gigpo"])
def test_one_step_raises_the_good_option_and_lowers_the_bad_one(tiny_model_dir, tmp_path, estimator):
    """One task, two one-turn episodes in the same state: option 0 succeeds, option 1 crashes. Each estimator gives
    the first a positive and the second a negative advantage, and one SGD step raises log pi(0|s) and lowers
    log pi(1|s)."""
    trainer = _trainer(
        tiny_model_dir, tmp_path, advantage_estimator=estimator, max_steps=1, num_iterations=1, curriculum=False,
        optim="sgd", learning_rate=0.5, lr_scheduler_type="constant", per_device_train_batch_size=2,
    )  # fmt: skip
    [(ids, offered)] = _prompts(trainer._tokenizer, 1)
    task = trainer.tasks.pools["all"][0]
    episodes = [
        _episode(task, 0, [(ids, offered, 0, 1.0, "s")]),
        _episode(task, 0, [(ids, offered, 1, -0.5, "s")]),
    ]
    trainer._play = lambda tasks, groups, state: episodes
    rows = trainer._episode_rows(episodes)
    assert rows[0].advantage > 0 > rows[1].advantage, [r.advantage for r in rows]

    def log_probs() -> torch.Tensor:
        with torch.no_grad():
            return trainer.option_head.forward(trainer.model, [ids], [offered]).log_probs[0]

    before = log_probs()
    trainer.train()
    after = log_probs()
    assert after[0] > before[0] and after[1] < before[1], (before, after)


def _gradient(trainer: ReflectPPOTrainer, episodes: list[Episode], micro_steps: int) -> list[torch.Tensor]:
    """The gradient ``micro_steps`` calls of ``trainer.training_step`` accumulate from one rollout of ``episodes``."""
    trainer._play = lambda tasks, groups, state: episodes
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = micro_steps
    trainer.model.zero_grad()
    for _ in range(micro_steps):
        trainer.training_step(trainer.model, [{}] * 4, None)
    return [p.grad.detach().clone() for p in trainer.model.parameters() if p.requires_grad]


def test_gradient_accumulation_gives_the_same_gradient(tiny_model_dir, tmp_path):
    """Through ``training_step`` (GRPO's buffering and Trainer's loss scaling): one micro-batch of the whole rollout
    and two accumulated half micro-batches give the same gradient -- the mean over all the window's turns. It would
    be halved if Trainer divided the loss by the accumulation steps (``loss_is_scaled_for_ga``)."""
    assert ReflectPPOTrainer.loss_is_scaled_for_ga is True
    prompts = _prompts(load_tokenizer(tiny_model_dir), 4)
    single = _trainer(
        tiny_model_dir, tmp_path / "ga1", per_device_train_batch_size=4, gradient_accumulation_steps=1
    )
    task = single.tasks.pools["pickup"][0]
    episodes = [
        _episode(
            task,
            0,
            [(prompts[0][0], prompts[0][1], 0, 0.0, "a"), (prompts[1][0], prompts[1][1], 2, 1.0, "b")],
        ),
        _episode(task, 0, [(prompts[2][0], prompts[2][1], 1, -0.5, "a")]),
        _episode(task, 1, [(prompts[3][0], prompts[3][1], 3, 1.0, "c")]),
        _episode(task, 1, [(prompts[3][0], prompts[3][1], 4, -0.5, "c")]),
    ]
    whole = _gradient(single, episodes, 1)
    split = _trainer(
        tiny_model_dir, tmp_path / "ga2", per_device_train_batch_size=2, gradient_accumulation_steps=2
    )
    assert split.args.steps_per_generation == 2
    accumulated = _gradient(split, episodes, 2)
    assert any(g.abs().max() > 0 for g in whole)
    for a, b in zip(whole, accumulated, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_rows_refuse_advantages_of_another_episode():
    ep = Episode(task=None, seed=0)
    ep.turns.append(Turn(0, "s", ("a", "b"), None, [1, 2], 2, 0, 0, -0.7, 0.6))
    with pytest.raises(ValueError, match="1 turns but 2 advantages"):
        rl_batch.episode_rows([ep], [[0.1, 0.2]])


def test_the_trainer_takes_model_ids_and_builds_its_tasks_from_args(tiny_model_dir, tmp_path):
    """As TRL's trainers take a model id: the policy and the reflection model from folders, the tokenizers with them,
    the training tasks (and, with an eval_strategy, the evaluation episodes) from the config."""
    from reflect_trl.trainers.rl_config import ReflectPPOConfig
    from reflect_trl.trainers.rl_trainer import ReflectPPOTrainer

    args = ReflectPPOConfig(
        output_dir=str(tmp_path),
        env_name="taxi",
        num_train_tasks=3,
        max_steps=3,
        per_device_train_batch_size=2,
        num_generations=2,
        reflection_max_new_tokens=4,
        eval_strategy="steps",
        eval_steps=10,
        eval_episodes_per_stage=2,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
    )
    trainer = ReflectPPOTrainer(model=tiny_model_dir, reflection_model=tiny_model_dir, args=args)
    assert len(trainer.train_dataset) == 9, "3 tasks for each of taxi's 3 stages"
    assert len(trainer.eval_dataset) == 6
    assert trainer.processing_class is not None and trainer._reflection_tokenizer is not None
    reflection = trainer._reflection_model
    assert not any(p.requires_grad for p in reflection.parameters()), (
        "a reflection that does not learn is frozen"
    )
    trainer.train()
    assert trainer.state.global_step == 3
