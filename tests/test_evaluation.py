"""Evaluation harness: Wilson intervals, oracle/random policies, model policies, reports and transcripts."""

from __future__ import annotations

import json
import math
import random
import re
import shutil

import pytest
from transformers import AutoTokenizer

from reflect_trl.cli.eval import eval_cli
from reflect_trl.envs import make_env
from reflect_trl.evaluation import (
    EvalConfiguration,
    EvalSettings,
    eval_tasks,
    evaluate,
    read_transcripts,
    wilson_interval,
)


@pytest.mark.parametrize(
    ("k", "n", "lo", "hi"),
    [  # reference values (Wilson score interval, z = 1.96)
        (0, 10, 0.0, 0.2775),
        (10, 10, 0.7225, 1.0),
        (5, 10, 0.2366, 0.7634),
        (81, 263, 0.2553, 0.3662),
        (1, 100, 0.0018, 0.0545),
    ],
)
def test_wilson_interval_known_values(k, n, lo, hi):
    got_lo, got_hi = wilson_interval(k, n)
    assert got_lo == pytest.approx(lo, abs=1e-4)
    assert got_hi == pytest.approx(hi, abs=1e-4)


def test_wilson_interval_empty_is_uninformative():
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_oracle_policy_succeeds_everywhere():
    settings = EvalSettings(env_name="taxi", episodes_per_stage=30, seed=3)
    report = evaluate([EvalConfiguration("oracle", "oracle")], settings, progress=False)
    assert {r.stage for r in report.results} == {"pickup", "dropoff", "full"}
    for r in report.results:
        assert r.success_rate == 1.0 and r.crash_rate == 0.0 and r.episodes == 30


def test_intervals_count_distinct_instances():
    """DangerousTaxi's dropoff stage has 12 start states: 60 held-out episodes repeat them, every result records each
    episode's instance, and the interval is the Wilson interval of the distinct instances."""
    settings = EvalSettings(env_name="taxi", episodes_per_stage=60, seed=3, stages=["pickup", "dropoff"])
    report = evaluate([EvalConfiguration("random", "random")], settings, progress=False)
    by_stage = {r.stage: r for r in report.results}
    dropoff = by_stage["dropoff"]
    assert len(dropoff.instances) == 60 and len(set(dropoff.instances)) <= 12
    n = len(set(dropoff.instances))
    assert (dropoff.ci_low, dropoff.ci_high) == pytest.approx(wilson_interval(dropoff.success_rate * n, n))
    assert all(key.startswith("dropoff:") for key in dropoff.instances)
    assert f"Distinct instances of stage `dropoff`: {n} of 60 episodes." in report.markdown()
    assert json.loads(json.dumps(report.to_json()))["results"][1]["instances"] == dropoff.instances


def _success_probability(env, steps_left: int, memo: dict, oracle_weight: float) -> float:
    """Exact probability of success from the env's state within steps_left steps, for the policy that takes the
    oracle's action with probability ``oracle_weight`` and otherwise a uniformly drawn one (0: uniform random)."""
    key = (env.state, env.mode, steps_left)
    if key in memo:
        return memo[key]
    if steps_left == 0:
        return 0.0
    oracle = env.oracle_action()
    total = 0.0
    for action in range(6):
        weight = (1 - oracle_weight) / 6 + oracle_weight * (action == oracle)
        probe = env.clone()
        _, _, terminated, truncated, info = probe.step(action)
        if info.get("success"):
            total += weight
        elif not (terminated or truncated):
            total += weight * _success_probability(probe, steps_left - 1, memo, oracle_weight)
    memo[key] = total
    return total


@pytest.mark.parametrize(
    ("policy", "oracle_weight"), [("random", 0.0), ("oracle_random", 0.1), ("oracle_random:0.5", 0.5)]
)
def test_scripted_policy_rate_is_within_the_exact_band(policy, oracle_weight):
    """The uniform random policy, "oracle + random 0.9" (the ``paper`` protocol's behaviour policy) and "oracle +
    random 0.5" succeed as often as their exact success probabilities, summed over the held-out episodes, say
    (within 4 sd)."""
    settings = EvalSettings(env_name="taxi", episodes_per_stage=300, stages=["pickup"], seed=5)
    report = evaluate([EvalConfiguration(policy, policy)], settings, progress=False)
    (result,) = report.results
    env = make_env("taxi")
    tasks, seeds = eval_tasks(settings, "pickup")
    memo: dict = {}
    probs = []
    for task, seed in zip(tasks, seeds, strict=True):
        env.reset(seed=seed, task=task)
        probs.append(_success_probability(env, env.horizon, memo, oracle_weight))
    mean = sum(probs)
    sd = math.sqrt(sum(p * (1 - p) for p in probs))
    assert 0 < mean < len(probs)
    assert abs(result.successes - mean) <= 4 * sd + 1, (result.successes, mean, sd)


def test_a_scripted_policy_parameter_is_checked_before_any_episode():
    """``oracle_random:<p>`` takes a probability in [0, 1]; a bad one is refused by name before anything runs, and a
    parameter on an actor that takes none is not a scripted policy (it is read as a model path)."""
    from reflect_trl.scripted_actors import is_scripted_policy, scripted_actor

    assert scripted_actor("oracle_random").random_action_prob == 0.9
    assert scripted_actor("oracle_random:0.25").random_action_prob == 0.25
    with pytest.raises(ValueError, match=r"must be in \[0, 1\], got 1.5"):
        EvalConfiguration("b", "oracle_random:1.5").check_models()
    with pytest.raises(ValueError, match="'oracle_random:half'.*'half' is not a number"):
        EvalConfiguration("b", "oracle_random:half").check_models()
    assert is_scripted_policy("oracle_random:0.5") and not is_scripted_policy("random:0.5")
    with pytest.raises(ValueError, match="unknown scripted policy 'random:0.5'"):
        scripted_actor("random:0.5")


def test_model_policy_with_reflection_report_and_transcripts(tiny_model_dir, tmp_path):
    settings = EvalSettings(
        env_name="taxi",
        episodes_per_stage=4,
        stages=["pickup", "full"],
        seed=1,
        batch_size=3,
        reflection_max_new_tokens=4,
    )
    confs = [
        EvalConfiguration("plain", tiny_model_dir),
        EvalConfiguration("reflect", tiny_model_dir, reflection=tiny_model_dir),
    ]
    report = evaluate(confs, settings, progress=False)
    assert len(report.results) == 2 * 2 * 2  # configurations x stages x decodings
    paths = report.write(tmp_path)
    data = json.loads(paths["json"].read_text())
    assert len(data["results"]) == 8
    table = paths["markdown"].read_text()
    assert table.count("| reflect |") == 4 and "95% CI" in table
    transcripts = read_transcripts(tmp_path / "transcripts" / "reflect__pickup__greedy.jsonl")
    assert len(transcripts) == 4
    turn = transcripts[0]["turns"][0]
    assert set(turn) >= {"state", "reflection", "options", "action", "reward"}
    assert turn["action"] in turn["options"] and turn["reflection"] is not None
    assert report.transcripts["reflect__pickup__greedy"] == transcripts  # round trip
    # same seed -> same table
    again = evaluate(confs, settings, progress=False)
    assert [r.successes for r in again.results] == [r.successes for r in report.results]
    assert [r.mean_return for r in again.results] == [r.mean_return for r in report.results]


def test_eval_cli_yaml_and_errors(tmp_path, capsys):
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(
        "env_name: taxi\nepisodes_per_stage: 3\nstages: [pickup]\nconfigurations:\n  - {name: o, policy: oracle}\n"
    )
    report = eval_cli(["--config", str(cfg), "--output_dir", str(tmp_path / "out")])
    assert report.results[0].success_rate == 1.0
    assert (tmp_path / "out" / "results.md").is_file()
    bad = tmp_path / "bad.yaml"
    bad.write_text("env_name: taxi\nepisodes: 3\nconfigurations: [{policy: oracle}]\n")
    with pytest.raises(SystemExit):
        eval_cli(["--config", str(bad)])
    assert "unknown setting(s) ['episodes']" in capsys.readouterr().err


def test_read_transcripts_names_the_bad_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(ValueError, match=r"t.jsonl:2"):
        read_transcripts(path)


def test_missing_model_directory_fails_before_any_episode(tmp_path):
    settings = EvalSettings(episodes_per_stage=2, stages=["pickup"], decodings=["greedy"])
    missing = str(tmp_path / "runs" / "rl_plain")
    confs = [EvalConfiguration("oracle", "oracle"), EvalConfiguration("RL w/o reflection", missing)]
    with pytest.raises(FileNotFoundError, match=r"'RL w/o reflection': policy .*rl_plain' does not exist"):
        evaluate(confs, settings)
    with pytest.raises(FileNotFoundError, match="reflection 'outputs/nowhere/refl' does not exist"):
        evaluate([EvalConfiguration("r", "oracle", "outputs/nowhere/refl")], settings)
    EvalConfiguration("hub", "org/model", "gpt2").check_models()  # hub ids are left to transformers


def _replay_actions(transcript: dict) -> list[tuple[int, int]]:
    """(taken action index, oracle action index) of every turn, replayed in a fresh environment."""
    from reflect_trl.envs import Task

    env = make_env("taxi")
    env.reset(seed=transcript["seed"], task=Task.from_dict(transcript["task"]))
    pairs = []
    for turn in transcript["turns"]:
        pairs.append((turn["action_index"], env.oracle_action()))
        env.step(turn["action_index"])
    return pairs


def test_scripted_policies_play_through_the_rollout_engine():
    from reflect_trl.seeding import derive_seed

    settings = EvalSettings(env_name="taxi", episodes_per_stage=6, stages=["dropoff"], seed=2, batch_size=4)
    confs = [
        EvalConfiguration("oracle", "oracle"),
        EvalConfiguration("random", "random"),
        EvalConfiguration("oracle_random", "oracle_random"),
        EvalConfiguration("never_random", "oracle_random:0"),
    ]
    report = evaluate(confs, settings, progress=False)
    # each plays its one decoding (ScriptedActor.decoding), whatever the settings' decodings
    assert sorted(report.transcripts) == [
        "never_random__dropoff__sampled",
        "oracle__dropoff__greedy",
        "oracle_random__dropoff__sampled",
        "random__dropoff__sampled",
    ]
    oracle = report.transcripts["oracle__dropoff__greedy"]
    assert [t["success"] for t in oracle] == [True] * 6
    never_random = report.transcripts["never_random__dropoff__sampled"]  # p = 0: the oracle's moves
    assert [[turn["action_index"] for turn in t["turns"]] for t in never_random] == [
        [turn["action_index"] for turn in t["turns"]] for t in oracle
    ]
    for transcript in oracle:
        assert all(taken == best for taken, best in _replay_actions(transcript))
        assert all(turn["logprob"] == 0.0 and turn["reflection"] is None for turn in transcript["turns"])
    random_runs = report.transcripts["random__dropoff__sampled"]
    for transcript in random_runs:
        for step, turn in enumerate(transcript["turns"]):
            n = len(turn["options"])
            draw = random.Random(derive_seed(transcript["seed"], "random_policy", step)).randrange(n)
            assert turn["action_index"] == draw and turn["logprob"] == pytest.approx(-math.log(n))
    mixed_runs = report.transcripts["oracle_random__dropoff__sampled"]
    for transcript in mixed_runs:
        for step, ((taken, best), turn) in enumerate(
            zip(_replay_actions(transcript), transcript["turns"], strict=True)
        ):
            n = len(turn["options"])
            rng = random.Random(derive_seed(transcript["seed"], "oracle_random_policy", step))
            expected = rng.randrange(n) if rng.random() < 0.9 else best
            assert taken == expected
            assert turn["logprob"] == pytest.approx(math.log(0.9 / n + 0.1 * (taken == best)))
    # Batch size does not change an episode.
    again = evaluate(confs, EvalSettings(**{**settings.__dict__, "batch_size": 1}), progress=False)
    assert again.transcripts == report.transcripts


def test_eval_prompts_use_the_labels_recorded_with_the_policy(tiny_model_dir, tmp_path, monkeypatch):
    from reflect_trl.prompts import OPTIONS_HEADER, write_option_labels
    from reflect_trl.rollout import PolicyActor

    policy_dir = tmp_path / "policy"
    shutil.copytree(tiny_model_dir, policy_dir)
    write_option_labels(policy_dir, list("123456"))
    seen: list[tuple[tuple[str, ...], list[list[int]]]] = []
    act = PolicyActor.act

    def recording_act(self, prompt_ids, num_options, live=None):
        seen.append((self.option_head.labels, [list(x) for x in prompt_ids]))
        return act(self, prompt_ids, num_options, live=live)

    monkeypatch.setattr(PolicyActor, "act", recording_act)
    settings = EvalSettings(episodes_per_stage=2, stages=["pickup"], decodings=["greedy"], seed=1)
    evaluate([EvalConfiguration("p", str(policy_dir))], settings, progress=False)
    assert seen
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    for labels, batch in seen:
        assert labels == tuple("123456")
        for ids in batch:
            options = tokenizer.decode(ids).split(OPTIONS_HEADER)[1].splitlines()[:6]
            assert [line.split(". ")[0] for line in options] == list("123456")
    with pytest.raises(ValueError, match="differ from the labels"):
        evaluate(
            [EvalConfiguration("p", str(policy_dir))],
            EvalSettings(**{**settings.__dict__, "option_labels": "ABCDEF"}),
        )


def test_eval_command_line_takes_several_policies_in_order():
    from reflect_trl.cli.eval import parse_eval_args

    configurations, _, _ = parse_eval_args(
        ["--policy", "runs/sft", "--reflection", "runs/refl", "--name", "before",
         "--policy", "runs/rl", "--name", "after", "--reflection", "runs/refl", "--policy", "oracle"]
    )  # fmt: skip
    assert [(c.name, c.policy, c.reflection) for c in configurations] == [
        ("before", "runs/sft", "runs/refl"),
        ("after", "runs/rl", "runs/refl"),
        ("oracle", "oracle", None),
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--reflection", "r", "--policy", "p"], "--reflection 'r' comes before any --policy"),
        (
            ["--policy", "p", "--name", "a", "--name", "b"],
            "--name given twice for --policy 'p' \\('a', then 'b'\\)",
        ),
    ],
)
def test_eval_command_line_rejects_orphan_or_repeated_flags(argv, message, capsys):
    from reflect_trl.cli.eval import parse_eval_args

    with pytest.raises(SystemExit):
        parse_eval_args(argv)
    assert re.search(message, capsys.readouterr().err)


def test_reflection_diagnostics_count_named_followed_and_deviated_turns():
    from reflect_trl.evaluation import reflection_diagnostics
    from reflect_trl.rollout import Episode, Turn

    actions = ("move south", "move north", "pickup passenger")

    def turn(step, reflection, taken, optimal):
        return Turn(step, "s", actions, reflection, [], 3, taken, taken, 0.0, 0.0, optimal_actions=optimal)

    good = Episode(task=None, seed=0, success=True)
    good.turns = [
        turn(0, "Now move south.", 0, (0,)),  # named right, followed
        turn(
            1, "Next: move north then move south.", 1, (1,)
        ),  # names south last: wrong, deviated (took north)
    ]
    crashed = Episode(task=None, seed=1, crashed=True, info={"crash_cause": "pickup_not_at_passenger"})
    crashed.turns = [
        turn(0, "move north", 0, (0, 1)),  # named right (a tie), deviated to the other right one
        turn(1, "pickup passenger now", 2, (0,)),  # named wrong, followed, crashed
    ]
    counts = reflection_diagnostics([good, crashed])
    assert {k: counts[k] for k in ("turns", "known", "named", "named_right", "named_wrong", "followed")} == {
        "turns": 4, "known": 4, "named": 4, "named_right": 2, "named_wrong": 2, "followed": 2,
    }  # fmt: skip
    assert counts["deviated_from_right"] == 1 and counts["deviated_from_wrong"] == 1
    assert counts["crashes"] == 1 and counts["crashes_on_named_wrong"] == 1
    assert counts["crash_causes"] == {
        "pickup_not_at_passenger": 1,
        "on_named_wrong:pickup_not_at_passenger": 1,
    }


class _NamingPlayer:
    """A stand-in reflection player: names "move north" for prompts of even length, no action for the others."""

    tokenizer = None
    max_prompt_length = None

    def generate(self, prompts, prompt_ids=None):
        from reflect_trl.reflection.model import ReflectionBatch

        texts = ["go on, so I should move north." if len(p) % 2 == 0 else "I am not sure." for p in prompts]
        return ReflectionBatch(texts, [1] * len(prompts), [True] * len(prompts), [[] for _ in prompts])


def test_reflection_follower_takes_the_named_move_else_a_seeded_draw():
    """The follower takes the option showing the action its reflection names (through shuffled option orders);
    where the reflection names none, the option drawn from the episode seed and the turn."""
    from reflect_trl.envs.taxi import NORTH
    from reflect_trl.rollout import RolloutEngine
    from reflect_trl.scripted_actors import scripted_actor
    from reflect_trl.seeding import derive_seed

    engine = RolloutEngine(
        "taxi", scripted_actor("reflection_follower"), _NamingPlayer(), shuffle_options=True
    )
    tasks = make_env("taxi").make_tasks("validation", 24, seed=5)
    episodes = engine.run(tasks, list(range(100, 124)))
    named = drawn = 0
    positions = set()
    for episode in episodes:
        for turn in episode.turns:
            if turn.reflection.endswith("move north."):
                named += 1
                positions.add(turn.option)
                assert turn.action_index == NORTH and turn.logprob == 0.0
            else:
                drawn += 1
                n = turn.num_options
                draw = random.Random(
                    derive_seed(episode.seed, "reflection_follower_policy", turn.step)
                ).randrange(n)
                assert turn.option == draw and turn.logprob == pytest.approx(-math.log(n))
    assert named > 0 and drawn > 0
    assert len(positions) > 1  # the shuffled prompts showed "move north" under different labels


def test_reflection_follower_needs_a_reflection_model():
    with pytest.raises(ValueError, match="reflection_follower policy .* give it a reflection model"):
        EvalConfiguration("follower", "reflection_follower").check_models()
    with pytest.raises(ValueError, match="needs a reflection player"):
        from reflect_trl.rollout import RolloutEngine
        from reflect_trl.scripted_actors import scripted_actor

        RolloutEngine("taxi", scripted_actor("reflection_follower")).run(
            make_env("taxi").make_tasks("test", 1)
        )
