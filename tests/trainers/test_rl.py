"""ReflectPPOTrainer on DangerousTaxi with tiny offline models."""

from __future__ import annotations

import json

import pytest
import torch
from test_rl_loss import StopAtStep

from reflect_trl.envs import make_env
from reflect_trl.models import load_causal_lm, load_tokenizer
from reflect_trl.trainers import rl_batch
from reflect_trl.trainers.replay import ReplayTurn
from reflect_trl.trainers.rl_config import ReflectPPOConfig
from reflect_trl.trainers.rl_tasks import eval_tasks_dataset, tasks_to_dataset
from reflect_trl.trainers.rl_trainer import ReflectPPOTrainer

STAGES = ("pickup", "dropoff", "full")


def _tasks(n: int = 8):
    env = make_env("taxi")
    return [t for s in STAGES for t in env.make_tasks("train", n, seed=0, difficulty=s)]


def _trainer(model_dir, out_dir, reflection=True, tasks=None, **overrides) -> ReflectPPOTrainer:
    kwargs = dict(
        output_dir=str(out_dir),
        per_device_train_batch_size=8,
        num_generations=4,
        max_steps=4,
        learning_rate=1e-3,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        reflection_max_new_tokens=6,
        seed=0,
        data_seed=0,
        log_episodes_every=2,
    )
    kwargs.update(overrides)
    args = ReflectPPOConfig(**kwargs)
    return ReflectPPOTrainer(
        model=load_causal_lm(model_dir),
        args=args,
        train_dataset=tasks_to_dataset(tasks if tasks is not None else _tasks()),
        eval_dataset=eval_tasks_dataset(args) if args.eval_strategy != "no" else None,
        processing_class=load_tokenizer(model_dir),
        reflection_model=load_causal_lm(model_dir, trainable=False) if reflection else None,
    )


def _metric_series(history, key):
    return [round(h[key], 6) for h in history if key in h]


@pytest.mark.parametrize("estimator", ["reinforce", "rloo", "gae", "gigpo"])
def test_training_runs_and_logs_env_metrics(tiny_model_dir, tmp_path, estimator):
    trainer = _trainer(tiny_model_dir, tmp_path, advantage_estimator=estimator, max_steps=3)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    logs = trainer.state.log_history
    keys = set().union(*(h.keys() for h in logs))
    for key in (
        "env/success_rate",
        "env/return",
        "env/episode_length",
        "env/crash_rate",
        "entropy",
        "rollout/reflection_stop_rate",
        "rollout/reflection_tokens",
        "curriculum/stage",
        "clip_fraction",
        "approx_kl",
        "policy_loss",
    ):
        assert key in keys, key
    if estimator == "gae":
        assert "value_loss" in keys and "explained_variance" in keys
        assert (tmp_path / "episodes").is_dir()
    changed = [
        n
        for n, p in trainer.model.named_parameters()
        if p.requires_grad and "reflect_value_head" not in n and not torch.equal(p, before[n])
    ]
    assert changed, "no policy parameter changed (the value head alone does not count)"


def test_without_reflection_uses_plain_prompts(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, reflection=False, max_steps=3)
    batch = trainer._generate_and_score_completions([{}] * 8)
    text = trainer._tokenizer.decode(batch["prompt_ids"][0][batch["prompt_mask"][0].bool()])
    assert "# Reflection:" not in text and text.endswith("# Action:\n")


def test_ratio_is_one_on_first_epoch(tiny_model_dir, tmp_path):
    """The old log-probs are the rollout's own: a re-scoring by the loss's forward (another batching) equals them up
    to float rounding, so the first epoch's ratio is 1."""
    trainer = _trainer(tiny_model_dir, tmp_path, num_iterations=2)
    trainer.model.train()
    chunk = trainer._prepare_inputs([{}] * 8)  # GRPO's buffering: generate, shuffle, split
    with torch.no_grad():
        table = trainer._option_scores(trainer.model, chunk).log_probs
    logp = table.gather(-1, chunk["option"][:, None]).squeeze(-1)
    torch.testing.assert_close(logp, chunk["old_logps"], rtol=0, atol=1e-4)


def test_reference_tables_memo_answers_turns_seen_before(tiny_model_dir, tmp_path):
    """With beta > 0 the reference tables of a turn scored before come from the memo: the second scoring of the same
    batch runs no reference forward and gives the same values, which equal a full scoring."""
    trainer = _trainer(tiny_model_dir, tmp_path, reflection=False, beta=0.05)
    trainer.model.train()
    batch = trainer._generate_and_score_completions([{}] * 8)
    assert trainer.ref_memo is not None and len(trainer.ref_memo) > 0
    assert "rollout/ref_memo_hit_rate" in trainer._metrics["train"]
    every = torch.ones_like(batch["turn_mask"], dtype=torch.bool)
    with torch.no_grad():
        full = trainer._option_tables(trainer.ref_model, batch, every)
    torch.testing.assert_close(batch["ref_log_probs"], full, rtol=0, atol=1e-5)
    calls = []
    hook = trainer.ref_model.register_forward_pre_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        again = trainer._reference_tables(batch)
    hook.remove()
    assert calls == [] and torch.equal(again, batch["ref_log_probs"])
    off = _trainer(tiny_model_dir, tmp_path / "off", reflection=False, beta=0.05, ref_logps_memo_size=0)
    assert off.ref_memo is None
    with pytest.raises(ValueError, match="ref_logps_memo_size must be >= 0"):
        ReflectPPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, ref_logps_memo_size=-1)


def test_old_logps_are_the_rollouts_and_replayed_turns_are_scored(tiny_model_dir, tmp_path):
    """No scoring forward runs after the rollout for its own turns; replayed turns (no sampling log-prob) are
    scored once, and every old log-prob equals a re-scoring up to rounding."""
    trainer = _trainer(tiny_model_dir, tmp_path, reflection=False, replay_buffer_size=64, replay_samples=3)
    trainer.model.train()
    trainer.replay.add([ReplayTurn((1, 2, 3) * 20, 0, 4, 1.0)])  # a stored turn to replay
    engine = trainer._rollout_engine(trainer.model)
    real_run, calls = engine.run, []

    def run_then_count(*args):
        episodes = real_run(*args)
        calls.append(trainer.model.register_forward_pre_hook(lambda *_: calls.append(1)))
        return episodes

    engine.run = run_then_count
    batch = trainer._generate_and_score_completions([{}] * 8)
    calls[0].remove()
    replayed = torch.isnan(batch["sampling_logps"])
    assert replayed.sum().item() == 3 and not torch.isnan(batch["old_logps"]).any()
    assert len(calls) - 1 in (1, 2), (
        "one scoring forward (prefix + suffix, or plain) for the replayed rows only"
    )
    with torch.no_grad():
        table = trainer._option_tables(trainer.model, batch, torch.ones_like(replayed))
    rescored = table.gather(-1, batch["option"][:, None]).squeeze(-1)
    torch.testing.assert_close(batch["old_logps"], rescored, rtol=0, atol=1e-4)


def test_curriculum_stage_advances_and_is_logged(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, max_steps=3, reflection=False)
    trainer.train()
    stages = _metric_series(trainer.state.log_history, "curriculum/stage")
    assert stages == [0.0, 1.0, 2.0]
    assert trainer.curriculum.stage == "full"
    assert any("stage/full/success_rate" in h for h in trainer.state.log_history)


def test_replay_buffer_fills_only_with_successes(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, reflection=False, replay_buffer_size=64, replay_samples=4)
    trainer.model.train()
    from reflect_trl.rollout import Episode

    real_run = trainer._rollout_engine(trainer.model).run

    def run_and_mark(tasks, seeds, groups):
        episodes: list[Episode] = real_run(tasks, seeds, groups)
        episodes[0].success = True  # pretend the first episode succeeded
        return episodes

    trainer._engine.run = run_and_mark
    trainer._generate_and_score_completions([{}] * 8)
    first = len(trainer.replay)
    assert first >= 1
    batch = trainer._generate_and_score_completions([{}] * 8)
    stored = torch.isnan(batch["sampling_logps"]) & (batch["turn_mask"] == 1)
    assert stored.sum().item() == 4  # four replayed turns (no sampling log-prob)
    replayed = batch["advantages"][stored]
    assert torch.allclose(replayed, torch.full_like(replayed, trainer.args.replay_weight))


def test_nan_loss_stops_with_step_in_message(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, reflection=False, max_steps=3)
    trainer._episode_rows = lambda episodes: [
        rl_batch.TurnRow(t.prompt_ids, t.option, t.num_options, float("nan"), sampling_logp=t.logprob)
        for ep in episodes
        for t in ep.turns
    ]
    trainer.args.whiten_advantages = False
    with pytest.raises(FloatingPointError, match="global step 0"):
        trainer.train()


@pytest.mark.parametrize(
    ("estimator", "reflection_temperature"), [("rloo", 1.0), ("gae", 0.0), ("gigpo", 0.0)]
)
def test_resume_reproduces_uninterrupted_run(tiny_model_dir, tmp_path, estimator, reflection_temperature):
    common = dict(
        max_steps=4,
        advantage_estimator=estimator,
        replay_buffer_size=32,
        replay_samples=2,
        reflection_temperature=reflection_temperature,  # 0: greedy reflections through the memo, saved with the run
        beta=0.05,  # the reference log-probs memo is saved with the run too
    )
    full = _trainer(tiny_model_dir, tmp_path / "full", **common)
    full.train()
    expected = [h for h in full.state.log_history if "loss" in h]

    first = _trainer(tiny_model_dir, tmp_path / "part", save_strategy="steps", save_steps=2, **common)
    first.args.max_steps = 4
    first.add_callback(StopAtStep(2))  # killed after the checkpoint at step 2
    first.train()
    ckpt = tmp_path / "part" / "checkpoint-2"
    assert (ckpt / "reflect_state_rank0.pt").is_file()
    resumed = _trainer(tiny_model_dir, tmp_path / "part", save_strategy="steps", save_steps=2, **common)
    resumed.train(resume_from_checkpoint=str(ckpt))
    if reflection_temperature == 0.0:  # the memo came back with the checkpoint, not empty
        assert len(resumed.reflection) > 0 and resumed._memo_counts["reflection"][1] > 0
    assert len(resumed.ref_memo) > 0
    got = [h for h in resumed.state.log_history if "loss" in h and h["step"] > 2]
    want = [h for h in expected if h["step"] > 2]
    assert len(got) == len(want) == 2
    for g, w in zip(got, want, strict=True):
        for key in (
            "loss", "env/success_rate", "env/return", "entropy", "approx_kl", "curriculum/stage",
            "rollout/reflection_cache_hit_rate",
        ):  # fmt: skip
            if key in w:
                assert g[key] == pytest.approx(w[key], rel=1e-5, abs=1e-6), (key, g, w)


def test_config_rejects_unknown_estimator():
    with pytest.raises(ValueError, match="advantage_estimator"):
        ReflectPPOConfig(output_dir="/tmp/x", advantage_estimator="ppo2", use_cpu=True, bf16=False)


def test_env_kwargs_json_string():
    cfg = ReflectPPOConfig(
        output_dir="/tmp/x", env_kwargs=json.dumps({"horizon": 7}), use_cpu=True, bf16=False
    )
    assert cfg.env_kwargs == {"horizon": 7}


def test_step_curriculum_needs_a_step_per_stage(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="max_steps=2 into 3 stages"):
        _trainer(tiny_model_dir, tmp_path, reflection=False, max_steps=2)


def test_rl_learns_a_simple_environment(tiny_llama_dir, tmp_path, monkeypatch):
    """The whole loop improves a policy: on LineWorld (walk to the goal cell; 'jump off' ends the episode), an
    untrained tiny model's success rate rises well above its start within 60 RL steps (seeded, CPU)."""
    import reflect_trl.envs
    from _toy_env import LineWorldEnv

    monkeypatch.setitem(reflect_trl.envs._REGISTRY, "line_world", "_toy_env:LineWorldEnv")
    env = make_env("line_world")
    tasks = [t for s in LineWorldEnv.stages for t in env.make_tasks("train", 32, seed=0, difficulty=s)]
    trainer = _trainer(
        tiny_llama_dir,
        tmp_path,
        reflection=False,
        tasks=tasks,
        env_name="line_world",
        per_device_train_batch_size=16,
        num_iterations=2,
        max_steps=60,
        learning_rate=3e-3,
        advantage_estimator="rloo",
        curriculum=False,
    )
    trainer.train()
    success = _metric_series(trainer.state.log_history, "env/success_rate")
    first, last = sum(success[:10]) / 10, sum(success[-10:]) / 10
    assert last >= first + 0.25 and last >= 0.7, (first, last)


def test_checkpoint_model_card_cites_reflect_rl(tiny_model_dir, tmp_path):
    trainer = _trainer(
        tiny_model_dir, tmp_path, reflection=False, max_steps=3, save_strategy="steps", save_steps=3
    )
    trainer.train()
    assert (tmp_path / "checkpoint-3").is_dir()
    card = (tmp_path / "README.md").read_text()  # written by the checkpoint save
    assert "2402.12621" in card and "Reflect-RL" in card
    assert "2402.03300" not in card  # not GRPO's DeepSeekMath citation


def test_option_labels_reach_the_prompts_and_the_head(tiny_model_dir, tmp_path):
    """With option_labels '1,...,6' the rollout prompts show '1. move south' and the trained token is a digit."""
    from reflect_trl.prompts import LABELS_FILE, read_option_labels

    trainer = _trainer(tiny_model_dir, tmp_path, reflection=False, option_labels="1,2,3,4,5,6")
    trainer.model.train()
    batch = trainer._generate_and_score_completions([{}] * 8)
    tok = trainer._tokenizer
    real = batch["turn_mask"] > 0
    for ids, mask, option in zip(
        batch["prompt_ids"][real], batch["prompt_mask"][real], batch["option"][real], strict=True
    ):
        text = tok.decode(ids[mask.bool()])
        block = text.split("# Options:\n")[1].split("# Action:")[0].splitlines()
        assert [line.split(".")[0] for line in block] == ["1", "2", "3", "4", "5", "6"], block
        label_token = trainer.option_head.label_ids[option].item()
        assert tok.decode([label_token]) == str(option.item() + 1)
    trainer.save_model(str(tmp_path / "final"))
    assert read_option_labels(tmp_path / "final") == ("1", "2", "3", "4", "5", "6")
    assert (tmp_path / "final" / LABELS_FILE).is_file()


def test_labels_recorded_with_the_policy_are_used_and_checked(tiny_model_dir, tmp_path):
    import shutil

    from reflect_trl.prompts import write_option_labels

    policy = tmp_path / "policy"
    shutil.copytree(tiny_model_dir, policy)
    write_option_labels(policy, "UVWXYZ")
    trainer = _trainer(str(policy), tmp_path / "a", reflection=False)
    assert trainer.option_head.labels == tuple("UVWXYZ")
    with pytest.raises(ValueError, match="differ from the labels"):
        _trainer(str(policy), tmp_path / "b", reflection=False, option_labels="ABCDEF")


def test_greedy_reflections_go_through_the_memo(tiny_model_dir, tmp_path):
    """reflection_temperature 0: the trainer's player is the memo, groups of one task hit it, the rate is logged;
    reflection_cache_size 0 or a sampling reflection model: the plain player."""
    from reflect_trl.reflection.cache import CachedReflectionPlayer

    trainer = _trainer(tiny_model_dir, tmp_path, reflection_temperature=0.0, max_steps=3)
    assert isinstance(trainer.reflection, CachedReflectionPlayer)
    trainer.train()
    rates = _metric_series(trainer.state.log_history, "rollout/reflection_cache_hit_rate")
    assert rates and all(0.0 < r <= 1.0 for r in rates), "4 episodes of one task share their first state"
    assert trainer.reflection.lookups > trainer.reflection.hits > 0
    plain = _trainer(tiny_model_dir, tmp_path / "off", reflection_temperature=0.0, reflection_cache_size=0)
    assert not isinstance(plain.reflection, CachedReflectionPlayer)
    sampled = _trainer(tiny_model_dir, tmp_path / "sampled", reflection_temperature=1.0)
    assert not isinstance(sampled.reflection, CachedReflectionPlayer)
    with pytest.raises(ValueError, match="reflection_cache_size must be >= 0"):
        ReflectPPOConfig(output_dir=str(tmp_path), reflection_cache_size=-1)


def test_rl_defaults_follow_the_paper_and_gigpo():
    """Constant learning rate (the authors' RL loop), gamma 0.95, no second normalisation of GiGPO's advantages,
    whitening for the other estimators."""
    common = dict(output_dir="/tmp/x", use_cpu=True, bf16=False)
    gigpo = ReflectPPOConfig(**common, advantage_estimator="gigpo")
    assert gigpo.lr_scheduler_type == "constant" and gigpo.gamma == 0.95
    assert gigpo.whiten_advantages is False and gigpo.scale_std_floor == 0.1
    assert ReflectPPOConfig(**common, advantage_estimator="rloo").whiten_advantages is True
    assert ReflectPPOConfig(**common, advantage_estimator="gigpo", whiten_advantages=True).whiten_advantages
    with pytest.raises(ValueError, match="lr_schedule_per_stage restarts"):
        ReflectPPOConfig(**common, lr_schedule_per_stage=True, curriculum=False)


def test_learning_rate_is_constant_or_restarts_at_every_stage(tiny_model_dir, tmp_path):
    constant = _trainer(tiny_model_dir, tmp_path / "c", reflection=False, max_steps=6)
    constant.train()
    assert _metric_series(constant.state.log_history, "learning_rate") == [1e-3] * 6
    restarted = _trainer(
        tiny_model_dir, tmp_path / "r", reflection=False, max_steps=6, lr_scheduler_type="linear",
        lr_schedule_per_stage=True,
    )  # fmt: skip
    restarted.train()
    # stages of 2 steps each (pickup, dropoff, full): linear decay from the full rate within every stage
    assert _metric_series(restarted.state.log_history, "learning_rate") == [1e-3, 5e-4] * 3


def test_train_tasks_come_from_a_file(tmp_path):
    from reflect_trl.trainers.rl_tasks import build_train_tasks

    tasks = _tasks(2)
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in tasks))
    args = ReflectPPOConfig(
        output_dir=str(tmp_path), train_tasks_file=str(path), curriculum_stages=["pickup", "full"], use_cpu=True,
        bf16=False,
    )  # fmt: skip
    assert build_train_tasks(args) == [t for t in tasks if t.difficulty in ("pickup", "full")]
    path.write_text(json.dumps({**tasks[0].to_dict(), "env": "auto_explore"}) + "\n")
    with pytest.raises(ValueError, match=r"tasks.jsonl:1: field 'env' is 'auto_explore'"):
        build_train_tasks(args)
