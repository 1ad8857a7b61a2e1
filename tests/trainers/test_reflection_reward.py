"""The reflection player's own reward (``reflection_reward``: advantage | verified | mixed) and the on-policy
supervision control (``reflection_objective: oracle_sft``): rewards and advantages by hand, the learning sign, the
rollout metrics, the start-up check and the label count a label-matched control reads."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from test_rl_reflection import _hand_token_logps, _trainer, _window

from reflect_trl import rl_math
from reflect_trl.envs.taxi import DangerousTaxiEnv
from reflect_trl.prompts import recommended_action, with_stop
from reflect_trl.reflection import get_oracle_reflector
from reflect_trl.trainers.rl_config import ReflectPPOConfig


# ---------------------------------------------------------------------------------------------------- rl_math
def test_verified_reward_of_an_optimal_a_non_optimal_and_a_missing_move():
    rewards = rl_math.verified_reflection_rewards([2, 0, None], [(1, 2), (1,), (0,)], no_move_penalty=0.5)
    assert rewards == [1.0, 0.0, -0.5]
    with pytest.raises(ValueError, match="turn 1: the environment gave no optimal actions"):
        rl_math.verified_reflection_rewards([0, 1], [(0,), None], 0.5)


def test_verified_advantages_are_relative_to_the_reflections_at_the_same_state():
    # task 0: three reflections at state "a" (rewards 1, 0, 0), one alone at "b"; task 1 meets "a" once, alone:
    # groups never cross tasks
    rewards = [1.0, 0.0, 0.0, 1.0, -0.5]
    groups = [0, 0, 0, 0, 1]
    keys = ["a", "a", "a", "b", "a"]
    adv, grouped = rl_math.state_group_advantages(rewards, groups, keys, scale="none")
    mean = sum(rewards) / 5  # the fallback for a state sampled once: the rollout's mean
    assert adv == pytest.approx([2 / 3, -1 / 3, -1 / 3, 1.0 - mean, -0.5 - mean])
    assert grouped == pytest.approx(3 / 5)
    scaled, _ = rl_math.state_group_advantages(rewards, groups, keys, scale="group", std_floor=0.1)
    std = (1 / 3) ** 0.5  # the sample std of 1, 0, 0
    assert scaled[:3] == pytest.approx([(2 / 3) / std, (-1 / 3) / std, (-1 / 3) / std], rel=1e-5)


def test_mixed_advantage_is_the_weighted_sum():
    assert rl_math.reflection_advantages("mixed", [1.0, -2.0], [0.5, 0.5], 0.25) == pytest.approx(
        [0.875, -1.375]
    )
    assert rl_math.reflection_advantages("verified", [1.0], [0.3], 0.25) == [0.3]
    assert rl_math.reflection_advantages("advantage", [1.0], None, 0.25) == [1.0]
    with pytest.raises(ValueError, match="needs one verified advantage per turn"):
        rl_math.reflection_advantages("verified", [1.0], None, 0.5)


def test_reflection_sft_loss_is_the_mean_target_nll():
    logp = torch.tensor([[0.0, -1.0, -3.0], [-2.0, 0.0, 0.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    assert rl_math.reflection_sft_losses(logp, mask).tolist() == pytest.approx([2.0, 0.0])


# ---------------------------------------------------------------------------------------------------- config
def test_reflection_reward_settings_are_checked():
    common = dict(output_dir="/tmp/x", use_cpu=True, bf16=False)
    learn = dict(common, train_reflection=True, reflection_temperature=1.0)
    with pytest.raises(
        ValueError, match="reflection_reward='oracle'; choose one of advantage, verified, mixed"
    ):
        ReflectPPOConfig(**learn, reflection_reward="oracle")
    with pytest.raises(ValueError, match="reflection_objective='dagger'; choose one of rl, oracle_sft"):
        ReflectPPOConfig(**learn, reflection_objective="dagger")
    with pytest.raises(ValueError, match=r"reflection_verified_weight must be in \[0, 1\], got 1.5"):
        ReflectPPOConfig(**learn, reflection_reward="mixed", reflection_verified_weight=1.5)
    with pytest.raises(ValueError, match="reflection_no_move_penalty must be >= 0"):
        ReflectPPOConfig(**learn, reflection_reward="verified", reflection_no_move_penalty=-1)
    with pytest.raises(
        ValueError, match="reflection_reward='verified' is about the reflection player's training"
    ):
        ReflectPPOConfig(**common, reflection_reward="verified")


# ---------------------------------------------------------------------------------------------------- trainer
#: reflection texts the rollouts of these tests read in turn (the tiny untrained model names no move): a move that is
#: optimal at some states, others, and none
NAMING = ("I go: move north", "Because of the wall, so I move south", "pickup passenger", "I am lost")


def _naming_moves(trainer) -> None:
    """Make the reflection player's texts name moves (its tokens, which the loss trains, are the model's own)."""
    generate, count = trainer.reflection.generate, iter(range(10**6))

    def renamed(prompts):
        batch = generate(prompts)
        return replace(batch, texts=[NAMING[next(count) % len(NAMING)] for _ in batch.texts])

    trainer.reflection.generate = renamed


def _played(trainer):
    """Run one rollout batch and return it with the episodes it played."""
    seen = {}
    play = trainer._play

    def spy(*args, **kwargs):
        seen["episodes"] = play(*args, **kwargs)
        return seen["episodes"]

    trainer._play = spy
    batch = trainer._generate_and_score_completions([{}] * 4)
    return batch, seen["episodes"]


@pytest.mark.parametrize("mode", ["verified", "mixed"])
def test_the_batch_carries_the_hand_computed_reflection_advantages(tiny_model_dir, tmp_path, mode):
    trainer = _trainer(
        tiny_model_dir,
        tmp_path,
        reflection_reward=mode,
        reflection_verified_weight=0.25,
        scale_rewards="none",
    )
    _naming_moves(trainer)
    batch, episodes = _played(trainer)
    turns = [t for ep in episodes for t in ep.turns]
    env = DangerousTaxiEnv()
    rewards, keys, groups = [], [], []
    for ep in episodes:  # replay each episode's actions to get every state's optimal moves and key by hand
        env.reset(seed=ep.seed, task=ep.task)
        for t in ep.turns:
            move = recommended_action(t.reflection, t.actions)
            rewards.append(-0.5 if move is None else float(move in env.optimal_actions()))
            keys.append(env.state_key())
            groups.append(ep.group)
            env.step(t.action_index)
    verified, _ = rl_math.state_group_advantages(rewards, groups, keys, scale="none")
    assert len(set(rewards)) == 3 and any(verified), "the test sees optimal, other and missing moves"
    n = len(turns)
    want = verified
    if mode == "mixed":
        want = [0.75 * a + 0.25 * v for a, v in zip(batch["advantages"][:n].tolist(), verified, strict=True)]
    assert batch["reflection_advantages"][:n].tolist() == pytest.approx(want, abs=1e-6)
    assert batch["reflection_advantages"][n:].abs().sum() == 0, "padding rows carry no advantage"
    metrics = trainer._metrics["train"]
    share = sum(r == 1.0 for r in rewards) / n
    assert metrics["reflection/optimal_named_share"][-1] == pytest.approx(share)
    assert metrics["reflection/no_move_share"][-1] == pytest.approx(sum(r < 0 for r in rewards) / n)
    distinct = len({t.reflection for t in turns}) / len(set(keys))
    assert metrics["reflection/distinct_per_state"][-1] == pytest.approx(distinct)
    assert trainer._oracle_labels == n


def test_the_frozen_player_run_logs_the_reflection_metrics_too(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, train_reflection=False, reflection_temperature=0.0)
    _naming_moves(trainer)
    _, episodes = _played(trainer)
    n = sum(len(ep.turns) for ep in episodes)
    assert trainer._metrics["train"]["reflection/no_move_share"][-1] == pytest.approx(
        sum(t.reflection == NAMING[3] for ep in episodes for t in ep.turns) / n
    )
    assert 0.0 < trainer._metrics["train"]["reflection/optimal_named_share"][-1] < 1.0
    turns = [t for ep in episodes for t in ep.turns]  # rloo records no state keys: states by their text
    assert trainer._metrics["train"]["reflection/distinct_per_state"][-1] == pytest.approx(
        len({t.reflection for t in turns}) / len({t.state_text for t in turns})
    )
    assert trainer._oracle_labels == 0


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_verified_advantage_moves_its_reflection_tokens_logprob_its_way(tiny_model_dir, tmp_path, sign):
    """The reflection's loss reads the verified advantage, not the policy's: the policy's advantages are set against
    it and the reflection's tokens still move the verified advantage's way."""
    trainer = _trainer(
        tiny_model_dir, tmp_path, train_policy=False, reflection_beta=0.0, reflection_reward="verified"
    )
    trainer.model.train()
    batch = _window(trainer._generate_and_score_completions([{}] * 4))
    tokens = batch["reflection_token_mask"]
    batch["advantages"] = torch.full_like(batch["advantages"], -sign)
    batch["reflection_advantages"] = torch.zeros_like(batch["advantages"])
    batch["reflection_advantages"][0] = sign
    model = trainer.reflection_learner.model
    with torch.no_grad():
        before = (_hand_token_logps(model, batch)[0] * tokens[0]).sum()
    trainer.compute_loss(trainer.model, batch).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.5 * p.grad
        after = (_hand_token_logps(model, batch)[0] * tokens[0]).sum()
    assert (after - before) * sign > 0, (before, after)


def test_oracle_sft_trains_the_reflection_towards_the_oracle_text_at_visited_states(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, train_policy=False, reflection_objective="oracle_sft")
    trainer.model.train()
    batch, episodes = _played(trainer)
    batch = _window(batch)
    turns = [t for ep in episodes for t in ep.turns]
    tokenizer = trainer.reflection_learner.tokenizer
    # the target of every turn is the oracle reflector's text at that state, after the turn's reflection prompt
    reflector = get_oracle_reflector("taxi")
    assert type(trainer._teacher) is type(reflector)
    for row, turn in enumerate(turns):
        target = tokenizer(with_stop(turn.teacher_reflection), add_special_tokens=False)["input_ids"]
        n = len(target)
        assert batch["teacher_ids"][row, -n:].tolist() == target
        assert batch["teacher_token_mask"][row].sum() == n
        assert turn.teacher_reflection and turn.teacher_reflection != turn.reflection
    first = turns[0]
    assert any(a in first.teacher_reflection for a in first.actions), "the oracle's reflection names a move"
    model = trainer.reflection_learner.model
    mask = batch["teacher_token_mask"]

    def target_logp() -> torch.Tensor:
        logp, _ = trainer.reflection_learner.token_logps(model, batch, 1.0, sequences="teacher")
        return (logp * mask).sum()

    with torch.no_grad():
        before = target_logp()
    loss = trainer.compute_loss(trainer.model, batch)
    with torch.no_grad():  # the loss by hand: the mean over the real turns of each turn's mean target NLL
        logp, _ = trainer.reflection_learner.token_logps(model, batch, 1.0, sequences="teacher")
        real = batch["turn_mask"].bool()
        hand = (-(logp * mask).sum(-1) / mask.sum(-1).clamp(min=1))[real].mean()
    torch.testing.assert_close(loss.detach(), hand, rtol=1e-5, atol=1e-6)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= 0.05 * p.grad
        assert target_logp() > before
    assert trainer._oracle_labels == len(turns)


def test_a_run_with_an_oracle_reward_writes_how_many_labels_it_used(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, max_steps=3, reflection_reward="verified")
    trainer.train()
    trainer.save_model()
    record = json.loads((tmp_path / "reflection_labels.json").read_text())
    assert record["reflection_reward"] == "verified"
    assert record["oracle_labelled_turns"] == trainer._oracle_labels > 0


def test_an_environment_without_optimal_actions_is_refused_at_start_up(tiny_model_dir, tmp_path, monkeypatch):
    def unknown(self):
        raise NotImplementedError("no oracle here")

    monkeypatch.setattr(DangerousTaxiEnv, "optimal_actions", unknown)
    with pytest.raises(ValueError, match="environment 'taxi' cannot tell its optimal actions"):
        _trainer(tiny_model_dir, tmp_path, reflection_reward="verified")
    _trainer(
        tiny_model_dir, tmp_path, reflection_reward="advantage"
    )  # the policy's advantage needs no oracle
