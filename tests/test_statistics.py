"""``pipelines.statistics``: the t interval over seeds, the crossed bootstrap where instances repeat across seeds, and
the unseen-instance results beside all."""

from __future__ import annotations

import math

import pytest

from reflect_trl.pipelines.statistics import (
    attach_unseen,
    compare,
    compare_naming_rates,
    hierarchical_bootstrap,
    paired_bootstrap_difference,
    pool_rows,
    restrict_to_unseen,
    t_interval,
    t_quantile_975,
)


def _result(conf, stage, outcomes, instances, decoding="greedy"):
    k, n = sum(outcomes), len(outcomes)
    return {
        "configuration": conf,
        "stage": stage,
        "decoding": decoding,
        "successes": k,
        "episodes": n,
        "success_rate": k / n,
        "outcomes": list(outcomes),
        "instances": list(instances),
    }


def test_t_interval_by_hand():
    low, high = t_interval([0.1, 0.2, 0.3, None])  # None: a seed without episodes is left out
    half = 4.303 * 0.1 / math.sqrt(3)  # t_{0.975, 2} s / sqrt(n), s = 0.1
    assert (low, high) == pytest.approx((0.2 - half, 0.2 + half))
    assert t_interval([0.5]) is None and t_interval([]) is None
    assert t_quantile_975(4) == 2.776
    assert t_quantile_975(200) == pytest.approx(1.972, abs=2e-3)  # beyond the table: Cornish-Fisher
    with pytest.raises(ValueError, match="df must be >= 1"):
        t_quantile_975(0)


def test_instances_shared_by_every_seed_are_resampled_jointly():
    """Five seeds play the same two instances (as DangerousTaxi's `dropoff` repeats its 12 start states under every
    seed): "a" always succeeds, "b" always fails. Instances drawn once for all seeds give a pooled mean of 0, 1/2 or
    1, so the interval is [0, 1]; drawing them per seed, as if each seed had instances of its own, averages five
    independent draws and makes the interval far narrower than the evidence (two instances) allows."""
    outcomes = [[1] * 10 + [0] * 10 for _ in range(5)]
    keys = [["a"] * 10 + ["b"] * 10 for _ in range(5)]
    point, low, high = hierarchical_bootstrap(outcomes, keys, resamples=2000, seed=0)
    assert point == 0.5 and (low, high) == (0.0, 1.0)
    own = [[f"{s}{k}" for k in ks] for s, ks in enumerate(keys)]  # the same outcomes, instances of their own
    _, low_own, high_own = hierarchical_bootstrap(outcomes, own, resamples=2000, seed=0)
    assert low_own > 0.0 and high_own < 1.0


def test_paired_difference_with_shared_instances_and_without_instances():
    a = [[1, 1, 0, 0]] * 3
    b = [[0, 1, 0, 0]] * 3
    keys = [["x", "y", "z", "w"]] * 3  # shared across seeds: crossed
    diff, low, high = paired_bootstrap_difference(a, b, resamples=1000, seed=1, instances=keys)
    assert diff == pytest.approx(0.25) and low == 0.0 and high == pytest.approx(0.75)
    diff_plain, low_plain, _ = paired_bootstrap_difference(a, b, resamples=1000, seed=1)
    assert diff_plain == pytest.approx(0.25) and low_plain >= 0.0  # no instances: every episode its own


def test_a_seed_without_episodes_is_left_out_of_the_bootstrap():
    point, low, high = hierarchical_bootstrap([[1, 1, 0], []], [["a", "b", "c"], []], resamples=500)
    assert point == pytest.approx(2 / 3) and 0.0 <= low <= point <= high <= 1.0


def _per_seed():
    """Two seeds, two configurations; instance "s" is seen in training by both seeds."""
    out = {}
    for seed in (0, 1):
        keys = ["s", "s", f"u{seed}", f"v{seed}"]
        out[seed] = [
            _result("Reflect-RL", "full", [1, 1, 1, 0], keys),
            _result("Reflect SFT (before RL)", "full", [1, 1, 0, 0], keys),
        ]
    return out


def test_comparisons_carry_a_t_interval_and_the_unseen_result():
    per_seed = _per_seed()
    training = {seed: {"full": {"s"}} for seed in per_seed}
    pairs = [("Reflect-RL", "Reflect SFT (before RL)")]
    rows = pool_rows(per_seed, training, resamples=200)
    comparisons = compare(per_seed, pairs, ("greedy",), resamples=200)
    unseen = restrict_to_unseen(per_seed, training)
    attach_unseen(rows, comparisons, pool_rows(unseen, None, 200), compare(unseen, pairs, ("greedy",), 200))
    (c,) = comparisons
    assert c["diff"] == pytest.approx(0.25) and c["per_seed_diff"] == [0.25, 0.25]
    assert c["t_low"] == pytest.approx(0.25) and c["t_high"] == pytest.approx(0.25)  # no spread between seeds
    assert c["seen_share"] == pytest.approx(0.5) and c["episodes"] == 8
    assert c["unseen"]["diff"] == pytest.approx(0.5) and c["unseen"]["episodes"] == 4
    assert c["unseen"]["per_seed_diff"] == [0.5, 0.5]
    rl = next(r for r in rows if r["configuration"] == "Reflect-RL")
    assert rl["seen_share"] == pytest.approx(0.5)
    assert rl["unseen"]["success_rate"] == pytest.approx(0.5)
    assert rl["unseen"]["ci_low"] <= 0.5 <= rl["unseen"]["ci_high"] and rl["unseen"]["per_seed"] == [0.5, 0.5]


def test_a_stage_without_unseen_episodes_has_no_unseen_comparison():
    per_seed = _per_seed()
    training = {seed: {"full": {"s", "u0", "u1", "v0", "v1"}} for seed in per_seed}
    pairs = [("Reflect-RL", "Reflect SFT (before RL)")]
    rows = pool_rows(per_seed, training, resamples=100)
    comparisons = compare(per_seed, pairs, ("greedy",), resamples=100)
    unseen = restrict_to_unseen(per_seed, training)
    attach_unseen(rows, comparisons, pool_rows(unseen, None, 100), compare(unseen, pairs, ("greedy",), 100))
    assert comparisons[0]["unseen"] is None and comparisons[0]["seen_share"] == 1.0
    assert all(r["seen_share"] == 1.0 and r["unseen"]["success_rate"] is None for r in rows)


def test_optimal_naming_rates_are_compared_per_seed_with_a_t_interval():
    def row(configuration, right, known):
        return {
            "configuration": configuration,
            "stage": "full",
            "decoding": "greedy",
            "diagnostics": {"named_right": right, "known": known},
        }

    per_seed = {
        0: [row("a", 8, 10), row("b", 5, 10)],
        1: [row("a", 12, 20), row("b", 10, 20)],
        2: [row("a", 9, 10), row("b", 8, 10)],
    }
    (c,) = compare_naming_rates(per_seed, [("a", "b")])
    assert c["per_seed_diff"] == pytest.approx([0.3, 0.1, 0.1])
    assert c["rate_a"] == pytest.approx(29 / 40) and c["rate_b"] == pytest.approx(23 / 40)
    assert c["diff"] == pytest.approx(6 / 40)
    mean, sd = 0.5 / 3, (((0.3 - 0.5 / 3) ** 2 + 2 * (0.1 - 0.5 / 3) ** 2) / 2) ** 0.5
    half = 4.302652729911275 * sd / 3**0.5  # t_{0.975, 2}
    assert (c["t_low"], c["t_high"]) == pytest.approx((mean - half, mean + half), rel=1e-3)
    per_seed[1][1]["diagnostics"] = {}  # a row without known optimal moves: no comparison
    assert compare_naming_rates(per_seed, [("a", "b")]) == []
