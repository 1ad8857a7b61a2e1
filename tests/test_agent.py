"""ReflectAgent: a trained pair loaded in one call, acting on observations and playing episodes as training did."""

from __future__ import annotations

import json

import pytest
import torch

from reflect_trl.action_head import OptionHead, masked_log_probs
from reflect_trl.agent import ReflectAgent
from reflect_trl.envs import make_env
from reflect_trl.models import load_causal_lm, load_tokenizer
from reflect_trl.prompts import DEFAULT_LABELS, build_prompt, encode_prompts, write_option_labels
from reflect_trl.reflection.player import make_reflection_player
from reflect_trl.rollout import PolicyActor, RolloutEngine


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory, tiny_llama_dir):
    """A policy directory with recorded option labels (as `reflect-trl sft`/`rl` saves one)."""
    import shutil

    path = tmp_path_factory.mktemp("policy") / "policy"
    shutil.copytree(tiny_llama_dir, path)
    write_option_labels(path, DEFAULT_LABELS[:8])
    return str(path)


def test_act_scores_the_training_prompt_over_the_offered_options(policy_dir):
    agent = ReflectAgent.from_pretrained(policy_dir, device="cpu")
    assert agent.labels == DEFAULT_LABELS[:8] and agent.reflection is None
    env = make_env("taxi")
    observation = env.reset(task=env.make_tasks("test", 1, seed=0)[0])
    decision = agent.decide(observation)
    # the same numbers by hand: the plain prompt, one forward, the option head
    tokenizer, model = load_tokenizer(policy_dir), load_causal_lm(policy_dir, trainable=False)
    prompt = build_prompt(observation.text, observation.actions, None, labels=DEFAULT_LABELS[:8])
    ids = torch.tensor(encode_prompts(tokenizer, [prompt.text]))
    head = OptionHead(tokenizer, DEFAULT_LABELS[:8])
    with torch.no_grad():
        mask = torch.ones_like(ids)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, -1, head.label_ids]
        expected = masked_log_probs(logits, torch.tensor([prompt.num_options]))[0]
    assert decision.probabilities == pytest.approx(
        expected[: len(observation.actions)].exp().tolist(), abs=1e-5
    )
    assert sum(decision.probabilities) == pytest.approx(1.0, abs=1e-5)
    assert decision.action_index == int(expected.argmax()) == agent.act(observation)
    assert decision.action == observation.actions[decision.action_index] and decision.reflection is None


def test_play_matches_the_rollout_engine_and_is_json(policy_dir):
    agent = ReflectAgent.from_pretrained(policy_dir, reflection=policy_dir, reflection_max_new_tokens=6)
    env = make_env("taxi")
    tasks = env.make_tasks("test", 2, seed=3, difficulty="pickup")
    played = [agent.play(env, task) for task in tasks]
    # what RL rollouts and `reflect-trl eval` play with the same models (greedy policy, greedy reflections)
    actor = PolicyActor(agent.policy, agent.tokenizer, agent.head, greedy=True)
    reflection = make_reflection_player(
        "hf",
        model=agent.reflection.model,
        tokenizer=agent.reflection.tokenizer,
        max_new_tokens=6,
        temperature=0.0,
    )
    episodes = RolloutEngine("taxi", actor, reflection).run(tasks)
    for transcript, episode in zip(played, episodes, strict=True):
        assert [t["action"] for t in transcript["turns"]] == [t.action_text for t in episode.turns]
        assert [t["reflection"] for t in transcript["turns"]] == [t.reflection for t in episode.turns]
        assert transcript["success"] == episode.success and transcript["length"] == episode.length
        assert transcript["task"] == episode.task.to_dict()
        assert all(0.0 < t["probability"] <= 1.0 for t in transcript["turns"])
    json.dumps(played)


def test_play_takes_an_environment_name_and_samples_with_a_seed(policy_dir):
    sampler = ReflectAgent.from_pretrained(policy_dir, greedy=False, seed=1)
    first = sampler.play("taxi", seed=4)
    again = ReflectAgent.from_pretrained(policy_dir, greedy=False, seed=1).play("taxi", seed=4)
    assert first == again and first["task"]["env"] == "taxi" and first["length"] >= 1
    assert isinstance(first["success"], bool) and first["return"] == sum(t["reward"] for t in first["turns"])


def test_the_package_exports_it():
    import reflect_trl

    assert reflect_trl.ReflectAgent is ReflectAgent
