"""``reflect-trl reproduce``: pooled rows, paired bootstrap comparisons, and a 2-seed smoke run of the command."""

from __future__ import annotations

import dataclasses
import json

import pytest

from reflect_trl.pipelines.reproduce import (
    COMPARISONS,
    ReproduceConfig,
    compare,
    comparisons_table,
    exposure_table,
    pool_rows,
    results_table,
    run_reproduce,
    training_instances,
    with_instances,
)
from reflect_trl.pipelines.statistics import paired_bootstrap_difference

# the machine record of a summary (reproduce._machine) for the write-up tests
_MACHINE = {
    "cpu_count": 2,
    "processor": "x86_64",
    "platform": "Linux",
    "python": "3.12",
    "torch": "2",
    "cuda": False,
    "torch_threads": 2,
}


def _result(conf, stage, outcomes, decoding="greedy"):
    k, n = sum(outcomes), len(outcomes)
    return {
        "configuration": conf,
        "stage": stage,
        "decoding": decoding,
        "successes": k,
        "episodes": n,
        "success_rate": k / n,
        "outcomes": list(outcomes),
    }


def test_pool_rows_sums_the_seeds():
    per_seed = {
        0: [_result("A", "s", [1, 0, 1, 1]), _result("B", "s", [0, 0, 1, 0])],
        1: [_result("A", "s", [0, 0, 1, 0]), _result("B", "s", [1, 1, 1, 0])],
    }
    rows = {r["configuration"]: r for r in pool_rows(per_seed)}
    assert rows["A"]["successes"] == 4 and rows["A"]["episodes"] == 8
    assert rows["A"]["per_seed"] == [0.75, 0.25]
    assert rows["B"]["success_rate"] == pytest.approx(4 / 8)
    assert rows["A"]["ci_low"] < 0.5 < rows["A"]["ci_high"]
    with pytest.raises(ValueError, match="expected one result"):
        pool_rows({0: [_result("A", "s", [1])], 1: []})


def test_paired_bootstrap_edge_cases_and_pairing():
    same = [[1, 0, 1, 0, 1]]
    assert paired_bootstrap_difference(same, same, resamples=200) == (0.0, 0.0, 0.0)
    diff, low, high = paired_bootstrap_difference([[1] * 10, [1] * 5], [[0] * 10, [0] * 5], resamples=200)
    assert (diff, low, high) == (1.0, 1.0, 1.0)
    # Paired: a succeeds wherever b does, plus 8 more tasks -> every task's difference is >= 0, the interval is
    # above 0 (an unpaired comparison of 50 % vs 30 % on 40 episodes each would not be).
    b = [[1, 0] * 20]
    a = [[1, 0] * 12 + [1, 1] * 8]
    diff, low, high = paired_bootstrap_difference(a, b, resamples=2000, seed=1)
    assert diff == pytest.approx(8 / 40)
    assert 0.0 < low <= diff <= high < 0.4
    with pytest.raises(ValueError, match="share tasks"):
        paired_bootstrap_difference([[1, 0]], [[1]])


def test_bootstrap_resamples_instances_not_episodes():
    """Each instance repeated 5 times with identical outcomes: resampling instances gives exactly the interval of the
    deduplicated tasks (same draws), resampling episodes would claim a far narrower one."""
    a = [1, 1, 0, 1, 0, 1, 1, 0, 1, 1, 0, 1]
    b = [0, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 1]
    once = paired_bootstrap_difference([a], [b], resamples=2000, seed=3)
    keys = [[f"i{k}" for k in range(len(a)) for _ in range(5)]]
    rep_a, rep_b = [[x for x in a for _ in range(5)]], [[x for x in b for _ in range(5)]]
    clustered = paired_bootstrap_difference(rep_a, rep_b, resamples=2000, seed=3, instances=keys)
    assert clustered == pytest.approx(once)
    naive = paired_bootstrap_difference(rep_a, rep_b, resamples=2000, seed=3)
    assert naive[2] - naive[1] < 0.6 * (clustered[2] - clustered[1])
    with pytest.raises(ValueError, match="instance keys"):
        paired_bootstrap_difference([a], [b], instances=[["x"]])


def test_pooled_interval_counts_distinct_instances_per_seed():
    dup = dict(_result("A", "s", [1, 0] * 10), instances=["p", "q"] * 10)  # 20 episodes, 2 instances
    two = {r["configuration"]: r for r in pool_rows({0: [dup], 1: [dup]})}["A"]
    assert two["episodes"] == 40 and two["instances"] == 4 and two["success_rate"] == 0.5
    plain = {r["configuration"]: r for r in pool_rows({0: [_result("A", "s", [1, 0] * 10)]})}["A"]
    assert plain["instances"] == 20
    assert two["ci_high"] - two["ci_low"] > 1.5 * (plain["ci_high"] - plain["ci_low"])


def test_pool_rows_split_seen_and_unseen_instances():
    """Held-out episodes whose instance was one of the seed's training tasks are counted apart."""
    seed0 = dict(_result("A", "s", [1, 1, 0, 0, 1]), instances=["p", "p", "q", "r", "r"])
    seed1 = dict(_result("A", "s", [0, 1]), instances=["p", "q"])
    training = {0: {"s": {"p"}}, 1: {"s": {"q", "z"}}}
    (row,) = pool_rows({0: [seed0], 1: [seed1]}, training)
    assert row["seen"] == {"successes": 3, "episodes": 3, "instances": 2, "success_rate": 1.0}
    assert row["unseen"] == {"successes": 1, "episodes": 4, "instances": 3, "success_rate": 0.25}
    assert row["seen"]["episodes"] + row["unseen"]["episodes"] == row["episodes"]
    (plain,) = pool_rows({0: [seed0], 1: [seed1]})
    assert "seen" not in plain  # no training instances given
    (unknown,) = pool_rows({0: [seed0], 1: [seed1]}, {0: training[0]})  # one seed without them: no split
    assert "seen" not in unknown


def test_training_instances_of_a_taxi_demo_cover_the_dropoff_start_states(tmp_path):
    from reflect_trl.pipelines.demo import DemoConfig

    cfg = DemoConfig(output_dir=str(tmp_path))
    train = training_instances(cfg)
    assert set(train) == {"pickup", "dropoff", "full"}
    assert len(train["dropoff"]) == 12  # every dropoff start state is a training task
    held_out = with_instances([_result("A", "pickup", [1] * 300)], cfg)[0]["instances"]
    seen = {k for k in held_out if k in train["pickup"]}
    assert 0 < len(seen) < len(set(held_out))  # some held-out pickup instances were trained on, most were not


def test_with_instances_rebuilds_the_held_out_instances_of_a_demo_run(tmp_path):
    """A seed evaluated before instances were recorded gets them from its demo configuration; DangerousTaxi's
    dropoff stage repeats its 12 start states."""
    from reflect_trl.pipelines.demo import DemoConfig

    cfg = DemoConfig(output_dir=str(tmp_path), eval_episodes_per_stage=40)
    rows = [_result("A", stage, [1] * 40) for stage in ("pickup", "dropoff")]
    filled = with_instances(rows, cfg)
    assert all(len(r["instances"]) == 40 for r in filled) and "instances" not in rows[0]
    assert len(set(filled[1]["instances"])) <= 12 < len(set(filled[0]["instances"]))
    recorded = dict(rows[0], instances=["x"] * 40)
    assert with_instances([recorded], cfg)[0]["instances"] == ["x"] * 40
    with pytest.raises(ValueError, match="has 3 outcomes but its configuration gives 40"):
        with_instances([_result("A", "pickup", [1, 0, 1])], cfg)


def test_compare_reports_every_pair_and_stage():
    per_seed = {}
    for seed in (0, 1):
        per_seed[seed] = [
            _result(conf, stage, [1, 1, 0, 1] if conf == "Reflect-RL" else [0, 1, 0, 0])
            for conf in ("Reflect-RL", "Reflect SFT (before RL)", "SFT only")
            for stage in ("pickup", "dropoff")
        ]
    comparisons = compare(per_seed, COMPARISONS, ("greedy",), resamples=300)
    pairs = {(c["a"], c["b"], c["stage"]) for c in comparisons}
    stated = [("Reflect-RL", "Reflect SFT (before RL)"), ("Reflect-RL", "SFT only")]
    stated += [("Reflect SFT (before RL)", "SFT only")]  # reflection without RL
    assert pairs == {(a, b, s) for a, b in stated for s in ("pickup", "dropoff")}
    for c in comparisons:
        expected = 0.0 if c["a"] == "Reflect SFT (before RL)" else 0.5  # both score [0, 1, 0, 0]
        assert c["diff"] == pytest.approx(expected)
        assert c["per_seed_diff"] == [expected, expected]
        assert c["ci_low"] <= c["diff"] <= c["ci_high"]


def test_an_interval_does_not_depend_on_the_other_rows_and_pairs():
    """Adding a configuration to a summary leaves the intervals of the rows and comparisons it had unchanged."""
    import random

    rng = random.Random(0)
    confs = ("Reflect-RL", "Reflect SFT (before RL)", "SFT only")
    per_seed = {
        seed: [
            _result(c, stage, [rng.randint(0, 1) for _ in range(12)]) for c in confs for stage in ("a", "b")
        ]
        for seed in (0, 1, 2)
    }
    # without the configuration listed second: the others' rows and pairs come at other positions
    fewer = {
        seed: [r for r in results if r["configuration"] != "Reflect SFT (before RL)"]
        for seed, results in per_seed.items()
    }
    key_row = lambda r: (r["configuration"], r["stage"], r["decoding"])  # noqa: E731
    rows_all = {key_row(r): (r["ci_low"], r["ci_high"]) for r in pool_rows(per_seed, resamples=300)}
    rows_few = {key_row(r): (r["ci_low"], r["ci_high"]) for r in pool_rows(fewer, resamples=300)}
    assert len(rows_few) == 4 and all(rows_all[k] == v for k, v in rows_few.items())
    key = lambda c: (c["a"], c["b"], c["stage"], c["decoding"])  # noqa: E731
    all_pairs = {key(c): (c["ci_low"], c["ci_high"]) for c in compare(per_seed, COMPARISONS, resamples=300)}
    few_pairs = {key(c): (c["ci_low"], c["ci_high"]) for c in compare(fewer, COMPARISONS, resamples=300)}
    assert len(few_pairs) == 2 and len(all_pairs) == 6  # Reflect-RL - SFT only, per stage
    assert all(all_pairs[k] == v for k, v in few_pairs.items())


@pytest.mark.slow
def test_reproduce_smoke_two_seeds(tmp_path):
    """Two seeds' jobs in one pool of two worker processes; the pooled counts are the sums of the seeds' own
    evaluation files; every seed's summary times each of its jobs and its evaluation."""
    config = ReproduceConfig(
        seeds=[0, 1], env_name="taxi", output_dir=str(tmp_path), smoke=True, bootstrap_resamples=200, jobs=2
    )
    summary = run_reproduce(config)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["seeds"] == [0, 1] == summary["seeds"]
    for key in ("rows", "comparisons", "per_seed", "machine", "total_seconds"):
        assert key in on_disk
    for row in on_disk["rows"]:
        assert {"configuration", "stage", "decoding", "successes", "episodes", "per_seed"} <= set(row)
        assert len(row["per_seed"]) == 2
        assert row["successes"] == sum(row["per_seed_successes"])
        assert row["episodes"] == sum(row["per_seed_episodes"])
        assert 0 < row["instances"] <= row["episodes"]
        # the pooled counts are the sums of the seeds' own evaluation files
        for seed, k, n in zip((0, 1), row["per_seed_successes"], row["per_seed_episodes"], strict=True):
            results = json.loads((tmp_path / f"seed_{seed}" / "eval" / "results.json").read_text())["results"]
            (match,) = [
                r
                for r in results
                if (r["configuration"], r["stage"], r["decoding"])
                == (row["configuration"], row["stage"], row["decoding"])
            ]
            assert (match["successes"], match["episodes"]) == (k, n)
    stages = {r["stage"] for r in on_disk["rows"]}
    configurations = {r["configuration"] for r in on_disk["rows"]}
    assert on_disk["protocol"] == "strict"
    assert on_disk["rl_steps"] == 3  # the smoke runs' RL steps, resolved
    same_decoding = {
        (c["a"], c["b"], c["stage"]) for c in on_disk["comparisons"] if c["decoding_b"] == c["decoding"]
    }
    assert same_decoding == {(a, b, s) for a, b in COMPARISONS if {a, b} <= configurations for s in stages}
    for c in on_disk["comparisons"]:
        assert {"a", "b", "stage", "diff", "ci_low", "ci_high"} <= set(c)
        assert c["ci_low"] <= c["diff"] <= c["ci_high"]
    md = (tmp_path / "results.md").read_text()
    assert "| configuration |" in md and "Reflect-RL" in md
    assert md.startswith("# reflect-trl reproduce: taxi, protocol `strict` (3 RL steps), seeds 0, 1\n")
    for row in on_disk["rows"]:  # held-out episodes split by whether the instance was a training task
        assert row["seen"]["episodes"] + row["unseen"]["episodes"] == row["episodes"]
        assert row["seen"]["successes"] + row["unseen"]["successes"] == row["successes"]
    assert "Success on the unseen instances" in md and exposure_table(on_disk["rows"], "greedy") in md
    # beside every comparison: the share on trained instances and the unseen comparison
    for c in on_disk["comparisons"]:
        assert 0.0 <= c["seen_share"] <= 1.0 and (c["unseen"] is None or "t_low" in c["unseen"])
        assert "t_low" in c and "episodes" in c
    assert on_disk["command"] is None  # run_reproduce called directly; the CLI records its command line
    assert (tmp_path / "success_by_seed_greedy.png").is_file()
    from reflect_trl.pipelines.demo import demo_jobs, job_label

    for seed in (0, 1):
        timings = on_disk["per_seed"][str(seed)]["timings_seconds"]
        seed_dir = tmp_path / f"seed_{seed}"
        runs = demo_jobs(config.demo_config(seed), seed_dir, seed_dir, seed_dir / "runs")
        expected = {f"{job_label(j)} {j.name}" for j in runs} | {"5/5 evaluation, table and plots"}
        assert expected <= set(timings) and all(v > 0 for v in timings.values())
        assert on_disk["per_seed"][str(seed)]["total_seconds"] >= max(timings.values())
        assert (seed_dir / "logs" / "evaluation.log").is_file() and (
            seed_dir / "logs" / "rl_reflect.log"
        ).is_file()
    assert on_disk["jobs"] == 2 and "pool of 2 worker processes" in md
    # a second call with the same settings reuses both finished seeds: same rows, no job run (no log rewritten);
    # jobs=0 (the demo's own number) must not need a seed to run
    logs = {s: (tmp_path / f"seed_{s}" / "logs" / "evaluation.log").stat().st_mtime_ns for s in (0, 1)}
    again = run_reproduce(dataclasses.replace(config, jobs=0))
    assert again["rows"] == summary["rows"]
    assert {
        s: (tmp_path / f"seed_{s}" / "logs" / "evaluation.log").stat().st_mtime_ns for s in (0, 1)
    } == logs


def test_finished_summary_needs_the_same_configuration(tmp_path):
    from dataclasses import asdict, replace

    from reflect_trl.pipelines.protocols import CONFIGURATIONS, configurations_of
    from reflect_trl.pipelines.reproduce import finished_summary

    cfg = ReproduceConfig(seeds=[3], output_dir=str(tmp_path), smoke=True).demo_config(3)
    seed_dir = tmp_path / "seed_3"
    seed_dir.mkdir()
    assert finished_summary(cfg) is None  # nothing there
    (seed_dir / "demo_config.json").write_text(json.dumps(asdict(cfg)))
    assert finished_summary(cfg) is None  # started, not finished
    rows = [{"configuration": CONFIGURATIONS[name].label} for name in configurations_of(cfg)]
    finished = {"rl_steps": cfg.rl_steps, "results": rows}
    (seed_dir / "summary.json").write_text(json.dumps(finished))
    assert finished_summary(cfg) == finished
    assert finished_summary(replace(cfg, rl_steps=cfg.rl_steps + 1)) is None  # another configuration
    # a protocol whose rows or RL steps changed in the code since the run (the config fields left unset are equal)
    (seed_dir / "summary.json").write_text(json.dumps({**finished, "results": rows[1:]}))
    assert finished_summary(cfg) is None
    (seed_dir / "summary.json").write_text(json.dumps({**finished, "rl_steps": cfg.rl_steps + 1}))
    assert finished_summary(cfg) is None
    (seed_dir / "summary.json").write_text(json.dumps({"results": rows}))  # a run before the rl_steps record
    assert finished_summary(cfg) is None
    (seed_dir / "summary.json").write_text(json.dumps(finished))
    older = {k: v for k, v in asdict(cfg).items() if k != "rl_eval_steps"}  # a run before a new field
    (seed_dir / "demo_config.json").write_text(json.dumps(older))
    assert finished_summary(cfg) is None
    (seed_dir / "demo_config.json").write_text(json.dumps(asdict(cfg)))
    (seed_dir / "summary.json").write_text("{not json")
    assert finished_summary(cfg) is None


def test_the_wall_time_table_matches_steps_by_name():
    """Seeds finish their jobs in different orders: each column holds one step of every seed; a step a seed lacks
    shows as a dash."""
    from reflect_trl.pipelines.reproduce import results_markdown

    machine = dict(_MACHINE)
    summary = {
        "env_name": "taxi",
        "seeds": [0, 1],
        "rows": [],
        "comparisons": [],
        "per_seed": {
            "0": {"total_seconds": 600, "timings_seconds": {"SFT a": 10.0, "SFT b": 20.0, "RL c": 30.0}},
            "1": {"total_seconds": 660, "timings_seconds": {"SFT b": 21.0, "SFT a": 11.0, "eval": 5.0}},
        },
        "machine": machine,
        "total_seconds": 900,
        "jobs": 2,
    }
    md = results_markdown(summary)
    assert "| seed | wall time | SFT a | SFT b | RL c | eval |" in md
    assert "| 0 | 10.0 min | 10 s | 20 s | 30 s | – |" in md
    assert "| 1 | 11.0 min | 11 s | 21 s | – | 5 s |" in md
    assert "pool of 2 worker processes" in md and "This call: 15.0 min" in md


def test_evaluate_only_names_the_missing_runs(tmp_path):
    from reflect_trl.errors import UsageError
    from reflect_trl.pipelines.demo import DemoConfig, finish_pooled_demo

    with pytest.raises(UsageError, match=r"no finished run \['rl_plain', 'rl_reflect'"):
        finish_pooled_demo(DemoConfig(output_dir=str(tmp_path)))


def test_evaluate_only_refuses_runs_of_another_configuration(tmp_path):
    from dataclasses import asdict

    from reflect_trl.errors import UsageError
    from reflect_trl.pipelines.demo import DemoConfig, finish_pooled_demo
    from reflect_trl.pipelines.protocols import CONFIGURATIONS, PROTOCOLS

    for c in (CONFIGURATIONS[n] for n in PROTOCOLS["strict"].configurations):
        for run in (c.policy, c.reflection):
            if run:
                (tmp_path / "runs" / run).mkdir(parents=True, exist_ok=True)
                (tmp_path / "runs" / run / "config.json").write_text("{}")
    trained = DemoConfig(output_dir=str(tmp_path), rl_steps=150)
    (tmp_path / "demo_config.json").write_text(json.dumps(asdict(trained)))
    with pytest.raises(UsageError, match=r"other settings .* for \['rl_steps'\]; pass --config"):
        finish_pooled_demo(DemoConfig(output_dir=str(tmp_path), rl_steps=300, eval_episodes_per_stage=10))


def test_the_interval_includes_the_seed_to_seed_variance():
    """Two seeds whose differences point opposite ways: over instances within seeds the interval excludes 0 for
    each seed alone, but the two-level bootstrap (seeds first) covers both signs; one seed reduces to the
    instance bootstrap."""
    from reflect_trl.pipelines.statistics import hierarchical_bootstrap

    up, down = [1] * 40 + [0] * 10, [0] * 40 + [-1] * 10
    _, low, high = hierarchical_bootstrap([up, down], resamples=2000, seed=1)
    assert low < 0 < high
    point, low_one, high_one = hierarchical_bootstrap([up], resamples=2000, seed=1)
    assert point == pytest.approx(0.8) and 0 < low_one < point < high_one
    diff, low_pair, _ = paired_bootstrap_difference([[1] * 50], [[0] * 40 + [1] * 10], resamples=500)
    assert diff == pytest.approx(0.8) and low_pair > 0


def test_versus_best_compares_rl_with_its_start_at_the_starts_best_decoding():
    per_seed = {
        seed: [
            _result("Reflect-RL", "full", [1, 1, 0, 0], decoding="greedy"),
            _result("Reflect-RL", "full", [1, 0, 0, 0], decoding="sampled"),
            _result("Reflect SFT (before RL)", "full", [1, 1, 1, 0], decoding="greedy"),
            _result("Reflect SFT (before RL)", "full", [0, 0, 0, 0], decoding="sampled"),
        ]
        for seed in (0, 1)
    }
    rows = compare(
        per_seed, [("Reflect-RL", "Reflect SFT (before RL)")], ("greedy", "sampled"), 200,
        versus_best=[("Reflect-RL", "Reflect SFT (before RL)")],
    )  # fmt: skip
    by = {(c["decoding"], c["decoding_b"]): c["diff"] for c in rows}
    assert by == {("greedy", "greedy"): pytest.approx(-0.25), ("sampled", "sampled"): pytest.approx(0.25),
                  ("sampled", "greedy"): pytest.approx(-0.5)}  # fmt: skip


def test_versus_reference_compares_every_decoding_with_the_reference_rows_only_decoding():
    """The random policy has only a sampled row: Reflect SFT greedy and sampled are each compared with it."""
    per_seed = {
        seed: [
            _result("Reflect SFT (before RL)", "hard", [1, 1, 1, 0], decoding="greedy"),
            _result("Reflect SFT (before RL)", "hard", [1, 0, 0, 0], decoding="sampled"),
            _result("random policy", "hard", [0, 1, 0, 0], decoding="sampled"),
        ]
        for seed in (0, 1)
    }
    pair = ("Reflect SFT (before RL)", "random policy")
    assert compare(per_seed, [pair], ("greedy",), 200) == []  # a plain pair finds no greedy random row
    rows = compare(per_seed, [], ("greedy", "sampled"), 200, versus_reference=[pair])
    by = {(c["decoding"], c["decoding_b"]): c["diff"] for c in rows}
    assert by == {("greedy", "sampled"): pytest.approx(0.5), ("sampled", "sampled"): pytest.approx(0.0)}
    assert len(rows) == 2 and all(c["b"] == "random policy" and c["stage"] == "hard" for c in rows)


def test_restrict_to_unseen_keeps_the_instances_no_training_task_posed():
    from reflect_trl.pipelines.reproduce import restrict_to_unseen

    result = {**_result("A", "full", [1, 0, 1]), "instances": ["x", "y", "z"]}
    kept = restrict_to_unseen({0: [result]}, {0: {"full": {"y"}}})[0][0]
    assert kept["instances"] == ["x", "z"] and kept["outcomes"] == [1, 1] and kept["successes"] == 2
    assert kept["episodes"] == 2 and kept["success_rate"] == 1.0


def test_a_stage_without_unseen_instances_has_no_row_and_no_comparison():
    """Design D3: DangerousTaxi's `dropoff` has 12 start states, all of them SFT tasks at K = 10, so nothing of that
    stage is left to compare; it must not be reported as 0 % success."""
    from reflect_trl.pipelines.reproduce import restrict_to_unseen

    per_seed = {
        seed: [
            {**_result(conf, stage, [1, 0, 1]), "instances": ["a", "b", "c"]}
            for conf in ("Reflect-RL", "Reflect SFT (before RL)")
            for stage in ("pickup", "dropoff")
        ]
        for seed in (0, 1)
    }
    training = {seed: {"dropoff": {"a", "b", "c"}, "pickup": {"a"}} for seed in (0, 1)}
    unseen = restrict_to_unseen(per_seed, training)
    rows = pool_rows(unseen, resamples=200)
    assert {(r["configuration"], r["stage"]) for r in rows} == {
        ("Reflect-RL", "pickup"),
        ("Reflect SFT (before RL)", "pickup"),
    }
    assert all(r["episodes"] == 4 and r["success_rate"] == 0.5 for r in rows)
    comparisons = compare(unseen, COMPARISONS, ("greedy",), resamples=200)
    assert [(c["b"], c["stage"]) for c in comparisons] == [("Reflect SFT (before RL)", "pickup")]


def test_a_seed_without_unseen_instances_shows_a_dash_not_zero():
    """Design D3: a seed whose held-out `dropoff` instances were all trained on has no rate in that row; the tables
    print "–" for it, not a 0 % that reads as a failed seed, and the pooled rate counts only the other seed."""
    from reflect_trl.pipelines.reproduce import restrict_to_unseen

    per_seed = {
        seed: [
            {**_result(conf, "dropoff", [1, 1, 0]), "instances": ["a", "b", "c"]}
            for conf in ("Reflect-RL", "Reflect SFT (before RL)")
        ]
        for seed in (0, 1)
    }
    training = {0: {"dropoff": {"a", "b", "c"}}, 1: {"dropoff": {"a"}}}
    unseen = restrict_to_unseen(per_seed, training)
    rows = pool_rows(unseen, resamples=200)
    assert [r["per_seed"] for r in rows] == [[None, 0.5], [None, 0.5]]
    assert all(r["episodes"] == 2 for r in rows)
    assert "(– / 50)" in results_table(rows, "greedy")
    (comparison,) = compare(unseen, COMPARISONS, ("greedy",), resamples=200)
    assert comparison["per_seed_diff"] == [None, 0.0]
    assert "| – / +0 |" in comparisons_table([comparison], "greedy")


def test_results_name_the_split_they_were_measured_on():
    """A `validation` run (a setting being chosen) must not be written up as held-out `test` episodes."""
    from reflect_trl.pipelines.reproduce import results_markdown

    rows = pool_rows({0: [_result("Reflect-RL", "full", [1, 0])]}, resamples=50)
    summary = {
        "env_name": "taxi",
        "seeds": [0],
        "rows": rows,
        "comparisons": [],
        "per_seed": {"0": {"total_seconds": 60, "timings_seconds": {}}},
        "machine": _MACHINE,
        "total_seconds": 60,
        "jobs": 1,
    }
    for split_field in ({"split": "validation"}, {"demo_config": {"eval_split": "validation"}}):
        md = results_markdown({**summary, **split_field})
        assert "Held-out `validation` episodes" in md and "`test`" not in md
    assert "Held-out `test` episodes" in results_markdown(summary)  # summaries written before the field


def test_the_cli_records_the_command_that_regenerates_the_summary(monkeypatch):
    """summary.json names the command that regenerates it, always with its own --output_dir (the README's blocks
    print it)."""
    import reflect_trl.pipelines.reproduce as reproduce_module
    from reflect_trl.cli.reproduce import reproduce_cli

    seen = {}
    monkeypatch.setattr(reproduce_module, "run_reproduce", lambda config: seen.setdefault("config", config))
    reproduce_cli(["--seeds", "0", "1", "--protocol", "paper", "--rerun"])
    assert seen["config"].command == (
        "reflect-trl reproduce --seeds 0 1 --protocol paper --output_dir outputs/reproduce/taxi-paper"
    )
