"""benchmarks/reflection_reward_endpoints.py: the pre-registered endpoints P1-P5 on a synthetic pooled summary."""

from __future__ import annotations

import json

import pytest

from _benchmarks import load_benchmark

ep = load_benchmark("reflection_reward_endpoints")
STAGES = ("pickup", "dropoff", "full")


def summary(
    diffs: dict[str, tuple[float, float, float]] | None = None,
    full_rates: dict[str, float] | None = None,
    naming_t_low: float = 0.02,
    rl_seconds: tuple[float, float] = (600.0, 400.0),
    added_seconds: float = 300.0,
) -> dict:
    """A pooled summary: ``diffs[arm]`` = (diff, ci_low, ci_high) of arm − Reflect SFT on every stage (greedy),
    ``full_rates`` the greedy `full` success rates, P4's RL job seconds (verified, Reflect-RL) and every added job's
    seconds per seed."""
    diffs = diffs or {ep.VERIFIED: (0.05, 0.01, 0.09), ep.MIXED: (0.0, -0.03, 0.03)}
    full_rates = full_rates or {
        ep.VERIFIED: 0.40,
        ep.MIXED: 0.35,
        ep.ONLY_VERIFIED: 0.30,
        ep.DAGGER: 0.38,
        ep.LABEL_MATCHED: 0.20,
    }
    comparisons = []
    for arm, (diff, low, high) in diffs.items():
        for stage in STAGES:
            for decoding in ("greedy", "sampled"):
                comparisons.append(
                    {"a": arm, "b": ep.REFLECT_SFT, "stage": stage, "decoding": decoding, "decoding_b": decoding,
                     "diff": diff, "ci_low": low, "ci_high": high,
                     "unseen": {"diff": diff, "ci_low": low, "ci_high": high}}
                )  # fmt: skip
    comparisons.append(
        {"a": ep.VERIFIED, "b": ep.DAGGER, "stage": "full", "decoding": "greedy", "diff": 0.02, "ci_low": -0.03,
         "ci_high": 0.07}
    )  # fmt: skip
    rows = [
        {"configuration": c, "stage": "full", "decoding": "greedy", "success_rate": r}
        for c, r in full_rates.items()
    ]
    naming = [
        {"a": ep.VERIFIED, "b": ep.REFLECT_SFT, "stage": s, "decoding": "greedy", "rate_a": 0.8, "rate_b": 0.7,
         "diff": 0.1, "t_low": naming_t_low if s == "full" else 0.05, "t_high": 0.15}
        for s in STAGES
    ]  # fmt: skip
    timings = {"RL rl_both_verified": rl_seconds[0], "RL rl_reflect": rl_seconds[1]}
    timings.update({job: added_seconds for job in ep.ADDED_JOBS if job != "RL rl_both_verified"})
    timings["RL rl_both_verified"] = rl_seconds[0]
    return {
        "seeds": [0, 1, 2, 3, 4],
        "rl_steps": 300,
        "jobs": 2,
        "rows": rows
        + [{"configuration": "x", "stage": s, "decoding": "greedy", "success_rate": 0} for s in STAGES],
        "comparisons": comparisons,
        "reflection_naming": naming,
        "per_seed": {str(s): {"timings_seconds": dict(timings)} for s in range(5)},
    }


def test_p1_needs_full_above_zero_and_no_stage_below_zero():
    met, lines = ep.p1(summary())
    assert met and "-> met" in lines[0] and "-> not met" in lines[1]
    assert "full +5.0 [+1.0, +9.0]" in lines[0]
    met, _ = ep.p1(summary({ep.VERIFIED: (0.05, -0.01, 0.09), ep.MIXED: (0.02, -0.02, 0.05)}))
    assert not met, "an interval reaching 0 on full is not met"
    s = summary()
    for c in s["comparisons"]:
        if c["a"] == ep.VERIFIED and c["stage"] == "pickup" and c["decoding"] == "greedy":
            c.update(diff=-0.1, ci_low=-0.15, ci_high=-0.05)
    met, lines = ep.p1(s)
    assert not met and "a stage below 0: pickup" in lines[0]


def test_p2_needs_every_stage_above_zero():
    assert ep.p2(summary())[0]
    met, lines = ep.p2(summary(naming_t_low=-0.01))
    assert not met and "full: 80.0 − 70.0 = +10.0 [t -1.0, +15.0]" in lines


def test_p3_takes_the_best_arm_and_asks_a_point_difference_of_at_least_zero_against_both_controls():
    met, lines = ep.p3(summary())
    assert met and f"best: {ep.VERIFIED}" in lines[0]
    assert f"{ep.VERIFIED} − {ep.DAGGER}: +2.0 points +2.0 [-3.0, +7.0]" in lines[1]
    rates = {
        ep.VERIFIED: 0.30,
        ep.MIXED: 0.35,
        ep.ONLY_VERIFIED: 0.30,
        ep.DAGGER: 0.38,
        ep.LABEL_MATCHED: 0.2,
    }
    met, lines = ep.p3(summary(full_rates=rates))
    assert not met and f"best: {ep.MIXED}" in lines[0]
    assert "-3.0 points (no interval in the summary for this pair)" in lines[1]


def test_p4_and_p5_budgets():
    assert ep.p4(summary(rl_seconds=(800.0, 400.0)))[0]
    met, lines = ep.p4(summary(rl_seconds=(801.0, 400.0)))
    assert not met and "ratio 2.00" in lines[0]
    # 10 jobs x 5 seeds x 240 s / 2 jobs at once = 100 min
    assert ep.p5(summary(added_seconds=240.0, rl_seconds=(240.0, 100.0)))[0]
    met, lines = ep.p5(summary(added_seconds=241.0, rl_seconds=(241.0, 100.0)))
    assert not met and lines[0].startswith("100.4 min over 5 seeds")


def test_the_command_prints_a_verdict_per_endpoint_and_names_a_bad_file(tmp_path, capsys):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary()))
    ep.main([str(path)])
    out = capsys.readouterr().out
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("P")] == [
        "P1",
        "P2",
        "P3",
        "P4",
        "P5",
    ]
    assert "P1: MET" in out and "P4: MET" in out
    (tmp_path / "seed.json").write_text(json.dumps({"config": {}}))
    with pytest.raises(SystemExit, match="seed.json: not a pooled summary"):
        ep.main([str(tmp_path / "seed.json")])
