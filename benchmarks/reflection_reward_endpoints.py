"""The pre-registered endpoints P1-P5 of the reflection's own reward, evaluated on a pooled ``summary.json``.

The endpoints are written in ``docs/studies/2026-12-07_reflection_reward.md`` (section "Pre-registered endpoints")
before the `test` run; this script applies them exactly as written to the summary of ``reflect-trl reproduce``
(``docs/results/taxi-reflection-reward/summary.json``) and prints one verdict per endpoint with its numbers::

    python benchmarks/reflection_reward_endpoints.py docs/results/taxi-reflection-reward/summary.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REFLECT_SFT = "Reflect SFT (before RL)"
REFLECT_RL = "Reflect-RL"
VERIFIED = "Reflect-RL, both learn (verified reward)"
MIXED = "Reflect-RL, both learn (mixed reward)"
ONLY_VERIFIED = "Reflect-RL, only the reflection learns (verified reward)"
DAGGER = "Reflection: on-policy oracle SFT (control)"
LABEL_MATCHED = "Reflection: SFT continued, label-matched (control)"
CONTROLS = (DAGGER, LABEL_MATCHED)
#: The jobs the added configurations need (P5): their RL / SFT runs, and their evaluations.
ADDED_JOBS = (
    "RL rl_both_verified",
    "RL rl_both_mixed",
    "RL rl_reflection_only_verified",
    "RL rl_reflection_dagger",
    "SFT sft_reflection_label_matched",
    *(f"evaluation {label}" for label in (VERIFIED, MIXED, ONLY_VERIFIED, DAGGER, LABEL_MATCHED)),
)


def _pts(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:+.1f}"


def _interval(c: Mapping[str, Any] | None) -> str:
    if not c:
        return "–"
    return f"{_pts(c['diff'])} [{_pts(c['ci_low'])}, {_pts(c['ci_high'])}]"


def comparison(
    summary: Mapping[str, Any], a: str, b: str, stage: str, decoding: str = "greedy"
) -> dict | None:
    for c in summary["comparisons"]:
        if (c["a"], c["b"], c["stage"], c["decoding"], c.get("decoding_b", c["decoding"])) == (
            a,
            b,
            stage,
            decoding,
            decoding,
        ):
            return c
    return None


def rate(summary: Mapping[str, Any], configuration: str, stage: str, decoding: str = "greedy") -> float:
    for r in summary["rows"]:
        if (r["configuration"], r["stage"], r["decoding"]) == (configuration, stage, decoding):
            return r["success_rate"]
    raise KeyError(f"the summary has no row {configuration!r} / {stage} / {decoding}")


def stages(summary: Mapping[str, Any]) -> list[str]:
    return list(dict.fromkeys(r["stage"] for r in summary["rows"]))


def p1(summary: Mapping[str, Any]) -> tuple[bool, list[str]]:
    """Either both-learn arm − Reflect SFT on greedy `full` > 0 with its bootstrap interval above 0, and no stage with
    that arm's interval entirely below 0."""
    lines, met = [], False
    for arm in (VERIFIED, MIXED):
        per_stage = {s: comparison(summary, arm, REFLECT_SFT, s) for s in stages(summary)}
        full = per_stage.get("full")
        arm_met = bool(full) and full["diff"] > 0 and full["ci_low"] > 0
        below = [s for s, c in per_stage.items() if c and c["ci_high"] < 0]
        arm_met = arm_met and not below
        met = met or arm_met
        cells = ", ".join(f"{s} {_interval(c)}" for s, c in per_stage.items())
        unseen = ", ".join(
            f"{s} {_interval((c or {}).get('unseen'))}"
            for s, c in per_stage.items()
            if s in ("pickup", "full")
        )
        sampled = ", ".join(
            f"{s} {_interval(comparison(summary, arm, REFLECT_SFT, s, 'sampled'))}" for s in stages(summary)
        )
        lines.append(
            f"{arm} − {REFLECT_SFT}, greedy: {cells}{'; a stage below 0: ' + ', '.join(below) if below else ''} "
            f"-> {'met' if arm_met else 'not met'}; unseen: {unseen}; sampled: {sampled}"
        )
    return met, lines


def p2(summary: Mapping[str, Any]) -> tuple[bool, list[str]]:
    """The closed-loop optimal-naming rate, both-learn verified − Reflect SFT: t interval above 0 on every stage."""
    naming = [
        c
        for c in summary.get("reflection_naming") or []
        if (c["a"], c["b"], c["decoding"]) == (VERIFIED, REFLECT_SFT, "greedy")
    ]
    if not naming:
        return False, ["no reflection_naming entry for both-learn verified − Reflect SFT (greedy)"]
    lines = [
        f"{c['stage']}: {100 * c['rate_a']:.1f} − {100 * c['rate_b']:.1f} = {_pts(c['diff'])} "
        f"[t {_pts(c['t_low'])}, {_pts(c['t_high'])}]"
        for c in naming
    ]
    return all(c["t_low"] is not None and c["t_low"] > 0 for c in naming), lines


def p3(summary: Mapping[str, Any]) -> tuple[bool, list[str]]:
    """The best RL arm on greedy `full` − each control: point difference >= 0 against both; and reflection-only
    verified − each control (the same policy: the clean comparison of signals)."""
    arms = {arm: rate(summary, arm, "full") for arm in (VERIFIED, MIXED, ONLY_VERIFIED)}
    best = max(arms, key=arms.get)
    lines = [
        "greedy full: " + ", ".join(f"{arm} {100 * r:.1f} %" for arm, r in arms.items()) + f"; best: {best}"
    ]
    met = True
    for control in CONTROLS:
        point = arms[best] - rate(summary, control, "full")
        met = met and point >= 0
        c = comparison(summary, best, control, "full")
        ahead = c is not None and c["ci_high"] < 0
        lines.append(
            f"{best} − {control}: {_pts(point)} points"
            + (f" {_interval(c)}" if c else " (no interval in the summary for this pair)")
            + (" — the control is ahead with its interval above 0" if ahead else "")
        )
    for control in CONTROLS:
        lines.append(
            f"{ONLY_VERIFIED} − {control}, full: {_interval(comparison(summary, ONLY_VERIFIED, control, 'full'))}"
        )
    return met, lines


def _job_seconds(summary: Mapping[str, Any], job: str) -> list[float]:
    return [s["timings_seconds"][job] for s in summary["per_seed"].values() if job in s["timings_seconds"]]


def p4(summary: Mapping[str, Any]) -> tuple[bool, list[str]]:
    """RL seconds per step of both-learn verified <= 2 x Reflect-RL's (job wall times / RL steps, mean over seeds)."""
    steps = summary.get("rl_steps") or 300
    verified = _job_seconds(summary, "RL rl_both_verified")
    reflect = _job_seconds(summary, "RL rl_reflect")
    if not verified or not reflect:
        return False, ["the per-seed timings lack RL rl_both_verified or RL rl_reflect"]
    a, b = sum(verified) / len(verified) / steps, sum(reflect) / len(reflect) / steps
    return a <= 2 * b, [
        f"{a:.2f} s/step (both learn, verified) vs {b:.2f} s/step (Reflect-RL): ratio {a / b:.2f}"
    ]


def p5(summary: Mapping[str, Any]) -> tuple[bool, list[str]]:
    """The added configurations' jobs take <= 100 min for five seeds: job seconds summed over seeds, over the 2 jobs
    that run at once."""
    per_job = {job: sum(_job_seconds(summary, job)) for job in ADDED_JOBS}
    missing = [job for job in ADDED_JOBS if not _job_seconds(summary, job)]
    parallel = summary.get("jobs") or 2
    minutes = sum(per_job.values()) / parallel / 60
    lines = [f"{minutes:.1f} min over {len(summary['per_seed'])} seeds ({parallel} jobs at once)"]
    lines += [f"  {job}: {seconds / 60:.1f} min" for job, seconds in per_job.items()]
    if missing:
        lines.append(f"  missing from the timings: {missing}")
    return minutes <= 100 and not missing, lines


ENDPOINTS = {"P1": p1, "P2": p2, "P3": p3, "P4": p4, "P5": p5}


def evaluate(summary: Mapping[str, Any]) -> dict[str, tuple[bool, list[str]]]:
    return {name: endpoint(summary) for name, endpoint in ENDPOINTS.items()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("summary", help="the pooled summary.json of reflect-trl reproduce")
    args = parser.parse_args(argv)
    try:
        summary = json.loads(Path(args.summary).read_text())
    except (OSError, ValueError) as err:
        sys.exit(f"{args.summary}: cannot read the summary ({err})")
    if "rows" not in summary or "comparisons" not in summary:
        sys.exit(f"{args.summary}: not a pooled summary of reflect-trl reproduce (no rows / comparisons)")
    print(f"seeds {summary['seeds']}, {summary.get('split', 'test')} split")
    for name, (met, lines) in evaluate(summary).items():
        print(f"{name}: {'MET' if met else 'NOT MET'}")
        for line in lines:
            print(f"    {line}")


if __name__ == "__main__":
    main()
