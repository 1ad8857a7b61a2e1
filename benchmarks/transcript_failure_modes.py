"""How the greedy DangerousTaxi episodes of a ``make reproduce`` run end, turn by turn, before and after RL (reads the
evaluation transcripts; runs no model):

    .venv/bin/python benchmarks/transcript_failure_modes.py --reproduce_dir outputs/reproduce/taxi \\
        --output outputs/reproduce/taxi/failure_modes.json

Every turn of every pooled episode is replayed in the environment. A turn's *named* action is the last action text
its reflection contains (the recommendation); an action is *optimal* when it starts a shortest crash-free route to
the stage's goal (ties included). Per configuration and stage:

* ``reflection_optimal``: share of turns whose named action is optimal;
* ``follows_reflection``: share of turns whose action is the named one;
* ``deviates_from_wrong`` / ``deviates_from_right``: share of turns whose action differs from a non-optimal / an
  optimal named action — what a policy that reads the state would raise / keep at 0;
* ``outcomes``: successes, crashes on the named (non-optimal) action, crashes against an optimal recommendation,
  other crashes, and episodes that ran out of steps.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from reflect_trl.envs import Task  # noqa: E402
from reflect_trl.envs.taxi import ACTIONS, DangerousTaxiEnv, taxi_dynamics  # noqa: E402
from reflect_trl.evaluation import read_transcripts, safe_filename  # noqa: E402
from reflect_trl.model_reflections import recommended_action  # noqa: E402

CONFIGURATIONS = ("Reflect SFT (before RL)", "Reflect-RL", "Reflect-RL w/o curriculum")
STAGES = ("pickup", "dropoff", "full")


def optimal_actions(state: int, goal: str) -> set[int]:
    """Actions that start a shortest crash-free route from ``state`` to ``goal`` (all ties)."""
    dyn = taxi_dynamics()
    distance = dyn.distance[goal][state]
    best = set()
    for a in range(len(ACTIONS)):
        if distance == 1:
            if dyn.is_success_edge(goal, state, a):
                best.add(a)
            continue
        nxt = dyn.next_state[state][a]
        if nxt != state and not dyn.gym_terminated[state][a] and dyn.distance[goal][nxt] == distance - 1:
            best.add(a)
    return best


def analyse(episodes: list[dict]) -> dict:
    turns, outcomes = Counter(), Counter()
    for ep in episodes:
        env = DangerousTaxiEnv()
        env.reset(task=Task(**ep["task"]))
        ended = "truncated"
        for turn in ep["turns"]:
            best = optimal_actions(env.state, env.goal)
            named = recommended_action(turn["reflection"], ACTIONS)
            action = ACTIONS.index(turn["action"])
            turns["all"] += 1
            turns["reflection_optimal"] += named in best
            turns["follows_reflection"] += action == named
            turns["deviates_from_wrong"] += named is not None and named not in best and action != named
            turns["deviates_from_right"] += named in best and action != named
            _, _, terminated, _, info = env.step(action)
            if info["crash"]:
                ended = (
                    "crash_on_named_wrong_action"
                    if action == named and named not in best
                    else "crash_against_optimal_recommendation"
                    if named in best
                    else "other_crash"
                )
            elif info["success"]:
                ended = "success"
        if bool(ep["success"]) != (ended == "success"):
            raise RuntimeError(f"replay of {ep['task']['task_id']} disagrees with its transcript")
        outcomes[ended] += 1
    n = max(turns.pop("all"), 1)
    return {
        "episodes": len(episodes),
        "turns": n,
        **{key: round(turns[key] / n, 4) for key in sorted(turns)},
        "outcomes": dict(sorted(outcomes.items())),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reproduce_dir", type=Path, default=Path("outputs/reproduce/taxi"))
    parser.add_argument("--decoding", default="greedy")
    parser.add_argument(
        "--output", type=Path, default=None, help="JSON (default: <reproduce_dir>/failure_modes.json)"
    )
    args = parser.parse_args()
    seeds = sorted(args.reproduce_dir.glob("seed_*/eval/transcripts"))
    if not seeds:
        raise SystemExit(f"no seed_*/eval/transcripts under {args.reproduce_dir}: run `make reproduce` first")
    result: dict = {"seeds": [p.parents[1].name for p in seeds], "decoding": args.decoding, "rows": []}
    for conf in CONFIGURATIONS:
        for stage in STAGES:
            name = safe_filename(f"{conf}__{stage}__{args.decoding}") + ".jsonl"
            episodes = [ep for folder in seeds for ep in read_transcripts(folder / name)]
            result["rows"].append({"configuration": conf, "stage": stage, **analyse(episodes)})
    out = args.output or args.reproduce_dir / "failure_modes.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    header = "| configuration | stage | reflection optimal | follows | deviates from wrong / right | success | crash on named wrong | crash against optimal |"
    print(header + "\n|" + "---|" * 8)
    for r in result["rows"]:
        o = r["outcomes"]
        print(
            f"| {r['configuration']} | {r['stage']} | {100 * r['reflection_optimal']:.1f} % | "
            f"{100 * r['follows_reflection']:.1f} % | {100 * r['deviates_from_wrong']:.1f} / "
            f"{100 * r['deviates_from_right']:.1f} % | {o.get('success', 0)} | "
            f"{o.get('crash_on_named_wrong_action', 0)} | {o.get('crash_against_optimal_recommendation', 0)} |"
        )
    print(f"(written to {out})")


if __name__ == "__main__":
    main()
