"""ReflectPPOTrainer on DangerousTaxi with tiny offline models."""

from __future__ import annotations

import json

import pytest
import torch

from _policy_data import write_policy_rows
from reflect_trl.envs import make_env
from reflect_trl.models import load_causal_lm, load_tokenizer
from reflect_trl.trainers.rl import (
    ReflectPPOConfig,
    ReflectPPOTrainer,
    eval_tasks_dataset,
    tasks_to_dataset,
)

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
        n for n, p in trainer.model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])
    ]
    assert changed, "no parameter changed"


def test_without_reflection_uses_plain_prompts(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, reflection=False, max_steps=3)
    batch = trainer._generate_and_score_completions([{}] * 8)
    text = trainer._tokenizer.decode(batch["prompt_ids"][0][batch["prompt_mask"][0].bool()])
    assert "# Reflection:" not in text and text.endswith("# Action:\n")


@pytest.mark.parametrize("epsilon", [0.0, 0.5])
def test_ratio_is_exactly_one_on_first_epoch(tiny_model_dir, tmp_path, epsilon):
    """Re-scored old log-probs with plain forwards: the ratio is exactly 1. Also with exploration: an explored turn
    records the policy's own log-prob of the option it took."""
    trainer = _trainer(
        tiny_model_dir,
        tmp_path,
        num_iterations=2,
        exploration_epsilon=epsilon,
        old_logps_from_rollout=False,
        shared_prefix_min_tokens=0,  # a shared prefix depends on the micro-batch's rows: equal up to rounding
    )
    trainer.model.train()
    chunk = trainer._prepare_inputs([{}] * 8)  # GRPO's buffering: generate, shuffle, split
    scores = trainer._score_options(
        trainer.model, chunk["prompt_ids"], chunk["prompt_mask"], chunk["num_options"], chunk["option"]
    )
    ratio = torch.exp(scores.logp - chunk["old_logps"])
    assert torch.equal(ratio, torch.ones_like(ratio))
    assert torch.all(scores.entropy >= 0)


def test_restricted_logps_match_rollout_sampling(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, old_logps_from_rollout=False)
    trainer.model.train()
    trainer._generate_and_score_completions([{}] * 8)
    gap = trainer._metrics["train"]["rollout/logp_gap_max"][-1]
    assert gap < 1e-4


def test_reference_logps_memo_answers_turns_seen_before(tiny_model_dir, tmp_path):
    """With beta > 0 the reference log-probs of a turn scored before come from the memo: the second scoring of the
    same batch runs no reference forward and gives the same values, which equal a full scoring."""
    trainer = _trainer(tiny_model_dir, tmp_path, reflection=False, beta=0.05)
    trainer.model.train()
    batch = trainer._generate_and_score_completions([{}] * 8)
    assert trainer.ref_memo is not None and len(trainer.ref_memo) > 0
    assert "rollout/ref_memo_hit_rate" in trainer._metrics["train"]
    with torch.no_grad():
        full = trainer._score_batched(trainer.ref_model, batch)
    torch.testing.assert_close(batch["ref_logps"], full, rtol=0, atol=1e-5)
    calls = []
    hook = trainer.ref_model.register_forward_pre_hook(lambda *_: calls.append(1))
    rows = batch["anchor_mask"] == 0
    with torch.no_grad():
        again = trainer._reference_logps(batch, rows, batch["old_logps"])
    hook.remove()
    assert calls == [] and torch.equal(again, batch["ref_logps"])
    # one unseen option in row 0: only it is scored
    changed = dict(batch, option=batch["option"].clone())
    changed["option"][0] = (changed["option"][0] + 1) % changed["num_options"][0]
    with torch.no_grad():
        mixed = trainer._reference_logps(changed, rows, batch["old_logps"])
        want = trainer._score_batched(trainer.ref_model, changed)
    torch.testing.assert_close(mixed, want, rtol=0, atol=1e-5)
    off = _trainer(tiny_model_dir, tmp_path / "off", reflection=False, beta=0.05, ref_logps_memo_size=0)
    assert off.ref_memo is None
    with pytest.raises(ValueError, match="ref_logps_memo_size must be >= 0"):
        ReflectPPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, ref_logps_memo_size=-1)


def test_old_logps_from_rollout_skip_the_scoring_forward(tiny_model_dir, tmp_path):
    """By default the old log-probs of sampled turns are the rollout's own (no scoring forward runs after the
    rollout); they equal a re-scoring up to rounding, so the first-epoch ratio is 1 within 1e-4. Stored rows (the
    SFT anchor) have no sampling log-prob and are scored."""
    rows = write_policy_rows(tmp_path / "policy.jsonl", n=6)
    for anchor_rows in (0, 3):
        extra = (
            dict(sft_anchor_data=str(tmp_path / "policy.jsonl"), sft_anchor_coef=1.0) if anchor_rows else {}
        )
        trainer = _trainer(
            tiny_model_dir, tmp_path, reflection=False, sft_anchor_samples=max(anchor_rows, 1), **extra
        )
        trainer.model.train()
        engine = trainer._rollout_engine(trainer.model)
        real_run, calls = engine.run, []

        def run_then_count(*args, _run=real_run, _calls=calls, _model=trainer.model):
            episodes = _run(*args)
            _calls.append(0)
            hook = _model.register_forward_pre_hook(lambda *_: _calls.__setitem__(0, _calls[0] + 1))
            _calls.append(hook)
            return episodes

        engine.run = run_then_count
        batch = trainer._generate_and_score_completions([{}] * 8)
        calls[1].remove()
        assert "rollout/logp_gap_max" not in trainer._metrics["train"]
        anchor = batch["anchor_mask"] == 1
        assert anchor.sum().item() == anchor_rows
        assert not torch.isnan(batch["old_logps"]).any()
        # no forward for the sampled turns; the anchor rows are scored (one prefix + one suffix forward or one plain)
        assert (calls[0] == 0) == (anchor_rows == 0)
        with torch.no_grad():
            rescored = trainer._score_batched(trainer.model, batch)
        torch.testing.assert_close(batch["old_logps"], rescored, rtol=0, atol=1e-4)
    assert rows


def test_curriculum_stage_advances_and_is_logged(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, max_steps=3, reflection=False)
    trainer.train()
    stages = _metric_series(trainer.state.log_history, "curriculum/stage")
    assert stages == [0.0, 1.0, 2.0]
    assert trainer.curriculum.stage == "full"
    assert any("stage/full/success_rate" in h for h in trainer.state.log_history)


def test_curriculum_mix_draws_a_share_from_the_other_stages(tiny_model_dir, tmp_path):
    """curriculum_mix_share: each task of a rollout comes from another stage with that probability; the stage's
    success is logged over its own episodes, the share of the others next to it."""
    import random

    from reflect_trl.seeding import derive_seed

    sequential = _trainer(tiny_model_dir, tmp_path / "seq", reflection=False, max_steps=3)
    expected_rng = random.Random(derive_seed(0, "tasks", 0))
    pool = sequential._pools["pickup"]
    assert sequential._draw_tasks(40) == [pool[expected_rng.randrange(len(pool))] for _ in range(40)]

    mixed = _trainer(
        tiny_model_dir, tmp_path / "mix", reflection=False, max_steps=3, curriculum_mix_share=0.5,
        per_device_train_batch_size=16,
    )  # fmt: skip
    drawn = [t.difficulty for t in mixed._draw_tasks(400)]
    assert mixed.curriculum.stage == "pickup"
    assert 0.4 < 1 - drawn.count("pickup") / 400 < 0.6
    assert drawn.count("dropoff") > 50 and drawn.count("full") > 50

    # Every episode of another stage "succeeds", none of the stage's own: the stage's success rate stays 0.
    real_run = mixed._rollout_engine(mixed.model).run

    def run_and_mark(tasks, seeds, groups):
        episodes = real_run(tasks, seeds, groups)
        for ep in episodes:
            ep.success = ep.task.difficulty != mixed.curriculum.stage
        return episodes

    mixed._engine.run = run_and_mark
    mixed.train()
    history = mixed.state.log_history
    others = _metric_series(history, "curriculum/other_stage_share")
    assert len(others) == 3 and all(0.0 <= x <= 1.0 for x in others) and max(others) > 0
    assert (
        _metric_series(history, "env/success_rate") == others
    )  # the others' episodes, and only they, succeed
    stage_rates = [h[k] for h in history for k in h if k.startswith("stage/") and k.endswith("/success_rate")]
    assert stage_rates and all(rate == 0.0 for rate in stage_rates)
    assert _metric_series(history, "curriculum/stage") == [0.0, 1.0, 2.0]


def test_curriculum_mix_share_is_checked():
    with pytest.raises(ValueError, match="curriculum_mix_share must be in \\[0, 1\\), got 1.0"):
        ReflectPPOConfig(output_dir="/tmp/x", curriculum_mix_share=1.0, use_cpu=True, bf16=False)
    with pytest.raises(ValueError, match="without one \\(curriculum: false\\)"):
        ReflectPPOConfig(
            output_dir="/tmp/x", curriculum_mix_share=0.2, curriculum=False, use_cpu=True, bf16=False
        )


def test_positive_advantage_weight_scales_the_positive_advantages(tiny_model_dir, tmp_path):
    """Weighted-REINFORCE: the same rollout with positive_advantage_weight 0.25 carries the positive advantages
    times 0.25 and the others unchanged."""
    batches = []
    for weight in (1.0, 0.25):
        trainer = _trainer(
            tiny_model_dir, tmp_path / str(weight), reflection=False, positive_advantage_weight=weight
        )
        trainer.model.train()
        batches.append(trainer._generate_and_score_completions([{}] * 8))
    plain, weighted = batches
    real = plain["turn_mask"] == 1
    torch.testing.assert_close(plain["option"], weighted["option"])  # the same episodes
    a, w = plain["advantages"][real], weighted["advantages"][real]
    assert (a > 0).any() and (a < 0).any()
    torch.testing.assert_close(w, torch.where(a > 0, 0.25 * a, a))
    with pytest.raises(ValueError, match="positive_advantage_weight must be in \\[0, 1\\], got 2.0"):
        ReflectPPOConfig(output_dir="/tmp/x", positive_advantage_weight=2.0, use_cpu=True, bf16=False)


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
    assert ((batch["value_mask"] == 0) & (batch["turn_mask"] == 1)).sum().item() == 4  # four replayed turns
    replayed = batch["advantages"][batch["value_mask"] == 0]
    assert torch.allclose(replayed, torch.full_like(replayed, trainer.args.replay_weight))


def test_sft_anchor_rows_join_every_rollout_batch(tiny_model_dir, tmp_path):
    rows = write_policy_rows(tmp_path / "policy.jsonl", n=6)
    trainer = _trainer(
        tiny_model_dir, tmp_path, reflection=False, sft_anchor_data=str(tmp_path / "policy.jsonl"),
        sft_anchor_coef=1.0, sft_anchor_samples=5, beta=0.05,
    )  # fmt: skip
    # a reference that differs from the policy, so that scoring an anchor row would show
    with torch.no_grad():
        for param in trainer.ref_model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=torch.Generator().manual_seed(0)))
    trainer.model.train()
    batch = trainer._generate_and_score_completions([{}] * 8)
    anchor = batch["anchor_mask"] == 1
    assert anchor.sum().item() == 5
    assert (batch["turn_mask"][anchor] == 1).all() and (batch["value_mask"][anchor] == 0).all()
    assert (batch["advantages"][anchor] == 0).all()
    # the KL term's reference log-probs: scored for the RL rows only; anchor rows keep their old log-prob (KL 0)
    with torch.no_grad():
        full_ref = trainer._score_batched(trainer.ref_model, batch)
    assert torch.allclose(batch["ref_logps"][~anchor], full_ref[~anchor], atol=1e-6)
    assert torch.equal(batch["ref_logps"][anchor], batch["old_logps"][anchor])
    # scoring them would have differed
    assert not torch.allclose(full_ref[anchor], batch["old_logps"][anchor])
    targets = {r["completion"].strip() for r in rows}
    assert {trainer.option_head.labels[o] for o in batch["option"][anchor].tolist()} <= targets
    history = trainer.train().metrics  # the whole loop runs with the anchor and logs its cross-entropy
    assert history["train_loss"] == history["train_loss"]  # finite
    logged = [h["sft_anchor/nll"] for h in trainer.state.log_history if "sft_anchor/nll" in h]
    assert len(logged) == trainer.args.max_steps and all(v > 0 for v in logged)


def test_nan_loss_stops_with_step_in_message(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, reflection=False, max_steps=3)
    trainer._turn_advantages = lambda episodes: ([[float("nan")] * ep.length for ep in episodes], None)
    trainer.args.whiten_advantages = False
    with pytest.raises(FloatingPointError, match="global step 0"):
        trainer.train()


@pytest.mark.parametrize(
    ("estimator", "task_sampling", "anchor", "reflection_temperature"),
    [("rloo", "uniform", False, 1.0), ("gae", "uniform", False, 0.0), ("gigpo", "failures", True, 0.0)],
)
def test_resume_reproduces_uninterrupted_run(
    tiny_model_dir, tmp_path, estimator, task_sampling, anchor, reflection_temperature
):
    common = dict(
        max_steps=4,
        advantage_estimator=estimator,
        replay_buffer_size=32,
        replay_samples=2,
        task_sampling=task_sampling,
        reflection_temperature=reflection_temperature,  # 0: greedy reflections through the memo, saved with the run
        beta=0.05,  # the reference log-probs memo is saved with the run too
    )
    if anchor:  # the SFT anchor's draws continue where the checkpoint left them
        write_policy_rows(tmp_path / "policy.jsonl", n=12)
        common.update(
            sft_anchor_data=str(tmp_path / "policy.jsonl"), sft_anchor_coef=0.5, sft_anchor_samples=3
        )
    full = _trainer(tiny_model_dir, tmp_path / "full", **common)
    full.train()
    expected = [h for h in full.state.log_history if "loss" in h]

    first = _trainer(tiny_model_dir, tmp_path / "part", save_strategy="steps", save_steps=2, **common)
    first.args.max_steps = 4
    # stop after the checkpoint at step 2
    from transformers import TrainerCallback

    class StopAt2(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 2:
                control.should_training_stop = True

    first.add_callback(StopAt2())
    first.train()
    ckpt = tmp_path / "part" / "checkpoint-2"
    assert (ckpt / "reflect_state_rank0.pt").is_file()
    resumed = _trainer(tiny_model_dir, tmp_path / "part", save_strategy="steps", save_steps=2, **common)
    resumed.train(resume_from_checkpoint=str(ckpt))
    if reflection_temperature == 0.0:  # the memo came back with the checkpoint, not empty
        assert len(resumed.reflection) > 0 and resumed._memo_counts[1] > 0
    assert len(resumed.ref_memo) > 0
    got = [h for h in resumed.state.log_history if "loss" in h and h["step"] > 2]
    want = [h for h in expected if h["step"] > 2]
    assert len(got) == len(want) == 2
    for g, w in zip(got, want, strict=True):
        for key in (
            "loss", "env/success_rate", "env/return", "entropy", "approx_kl", "curriculum/stage", "sft_anchor/nll",
            "rollout/reflection_cache_hit_rate",
        ):  # fmt: skip
            if key in w:
                assert g[key] == pytest.approx(w[key], rel=1e-5, abs=1e-6), (key, g, w)


def test_adaptive_entropy_state_survives_a_resume(tiny_model_dir, tmp_path):
    """The controller moves c_H once per optimizer step; its state is saved with a checkpoint (GRPOTrainer's hook)
    and read back on resume, so the resumed run continues from 0.02, not from the initial 0."""
    common = dict(
        reflection=False, curriculum=False, use_adaptive_entropy=True, entropy_coef=0.0, entropy_coef_delta=0.01,
        entropy_target=10.0, save_strategy="steps", save_steps=2,
    )  # fmt: skip
    first = _trainer(tiny_model_dir, tmp_path, max_steps=2, **common)
    first.train()
    assert first.entropy_coef == pytest.approx(0.02)  # entropy below the target at both steps
    saved = json.loads((tmp_path / "checkpoint-2" / "entropy_ctrl_state.json").read_text())
    assert saved["entropy_coef"] == pytest.approx(0.02)
    resumed = _trainer(tiny_model_dir, tmp_path, max_steps=3, **common)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert resumed.entropy_coef == pytest.approx(0.03)
    assert _metric_series(resumed.state.log_history, "entropy_coef") == [0.01, 0.02, 0.03]  # history kept


def test_config_rejects_unknown_estimator():
    with pytest.raises(ValueError, match="advantage_estimator"):
        ReflectPPOConfig(output_dir="/tmp/x", advantage_estimator="ppo2", use_cpu=True, bf16=False)


@pytest.mark.parametrize("epsilon", [-0.1, 1.0])
def test_config_rejects_exploration_outside_unit_interval(epsilon):
    with pytest.raises(ValueError, match=f"exploration_epsilon must be in \\[0, 1\\), got {epsilon}"):
        ReflectPPOConfig(output_dir="/tmp/x", exploration_epsilon=epsilon, use_cpu=True, bf16=False)


def test_exploration_share_is_logged(tiny_model_dir, tmp_path):
    trainer = _trainer(
        tiny_model_dir, tmp_path, max_steps=3, exploration_epsilon=0.3, advantage_estimator="gigpo"
    )
    trainer.train()
    shares = _metric_series(trainer.state.log_history, "rollout/explored_turn_share")
    assert len(shares) == 3 and all(0.0 < x < 0.8 for x in shares), shares


def test_config_rejects_unknown_task_sampling():
    with pytest.raises(ValueError, match="task_sampling='hardest'"):
        ReflectPPOConfig(output_dir="/tmp/x", task_sampling="hardest", use_cpu=True, bf16=False)
    with pytest.raises(ValueError, match="uniform_share must be in \\[0, 1\\], got 2.0"):
        ReflectPPOConfig(output_dir="/tmp/x", task_sampling_uniform_share=2.0, use_cpu=True, bf16=False)


def test_failure_sampling_draws_the_failed_instances(tiny_model_dir, tmp_path):
    env = make_env("taxi")
    tasks = env.make_tasks("train", 24, seed=0, difficulty="dropoff")
    trainer = _trainer(
        tiny_model_dir,
        tmp_path,
        tasks=tasks,
        curriculum=False,
        max_steps=2,
        task_sampling="failures",
        task_sampling_uniform_share=0.0,
    )
    keys = {env.instance_key(t) for t in tasks}
    assert len(keys) > 2  # 24 dropoff tasks pose several of the 12 start states
    failing = sorted(keys)[0]
    # every instance seen: one failing, the others solved
    trainer.task_priorities.update([(k, k != failing) for k in keys])
    drawn = trainer._draw_tasks(40)
    assert {env.instance_key(t) for t in drawn} == {failing}
    trainer.task_priorities.scores.clear()
    trainer.train()  # the rollouts' outcomes (every process) become the scores
    assert set(trainer.task_priorities.scores) <= keys and trainer.task_priorities.scores
    assert all(0.0 <= v <= 1.0 for v in trainer.task_priorities.scores.values())
    drawn_scores = _metric_series(trainer.state.log_history, "tasks/drawn_failure_score")
    assert len(drawn_scores) == 2 and drawn_scores[0] == 1.0  # nothing seen before the first rollout


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
