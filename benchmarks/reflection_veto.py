"""How much of a Reflect policy's failure is following its reflection into a crash, and what vetoing would gain
(DangerousTaxi, greedy policy and greedy reflections, one held-out split):

    .venv/bin/python benchmarks/reflection_veto.py \
        --policy outputs/reproduce/taxi/seed_0/runs/sft_policy \
        --reflection outputs/reproduce/taxi/seed_0/runs/sft_reflection \
        --compare outputs/reproduce/taxi/seed_0/runs/rl_reflect --output outputs/bench/reflection_veto.json

Per stage, for ``--policy``:

* ``success``: greedy success rate;
* ``follows_reflection``: share of turns whose action is the last action the reflection names (of the turns whose
  reflection names one), and ``failures_on_named_action``: failed episodes whose last action is that action;
* ``veto_oracle_1`` / ``veto_next_1`` / ``veto_next_all``: success when a move that would crash is replaced by the
  oracle's action (at most once per episode) / by the policy's best-ranked option that does not crash (once; every
  time). These are upper bounds on what a policy that learned to distrust the reflection's crash moves could gain,
  not results of any training;
* ``p_crash_action``: for each policy of ``--compare`` (and ``--policy``), the mean probability it gives the action
  that ended ``--policy``'s failed episodes, at those episodes' last turns (the same prompts for every policy).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from reflect_trl.action_head import OptionHead  # noqa: E402
from reflect_trl.batching import left_pad  # noqa: E402
from reflect_trl.evaluation import EvalSettings, eval_tasks  # noqa: E402
from reflect_trl.model_reflections import recommended_action  # noqa: E402
from reflect_trl.models import load_causal_lm, load_tokenizer  # noqa: E402
from reflect_trl.prompts import build_prompt, encode_prompts  # noqa: E402
from reflect_trl.reflection.model import ReflectionModel  # noqa: E402
from reflect_trl.rollout import Episode, LiveEpisode, PolicyActor, RolloutEngine  # noqa: E402

STAGES = ("pickup", "dropoff", "full")


def crashes(view: LiveEpisode, action_index: int) -> bool:
    """Would this action end the episode in a crash? (played on a copy of the live environment)"""
    env = copy.deepcopy(view.env)
    return bool(env.step(action_index)[4].get("crash", False))


class VetoActor(PolicyActor):
    """The greedy policy, except that a move that would crash is replaced (at most ``limit`` times an episode) by the
    oracle's action (``mode="oracle"``) or by the best-ranked option that does not crash (``mode="next"``)."""

    def __init__(self, model, tokenizer, head: OptionHead, mode: str, limit: int) -> None:
        super().__init__(model, tokenizer, head, greedy=True)
        self.mode, self.limit = mode, limit
        self.vetoes: dict[int, int] = {}

    def act(self, prompt_ids, num_options, live=None):
        options, logps, entropies, values = super().act(prompt_ids, num_options, live)
        logits = None
        for row, view in enumerate(live or []):
            used = self.vetoes.get(id(view.episode), 0)
            if used >= self.limit or not crashes(view, view.prompt.action_index(options[row])):
                continue
            if self.mode == "oracle":
                options[row] = view.prompt.option_of(view.env.oracle_action())
            else:
                if logits is None:
                    out = self._last_position_outputs(prompt_ids, False)
                    logits = out.logits[:, -1, :].index_select(
                        -1, self.option_head.label_ids.to(out.logits.device)
                    )
                ranked = logits[row, : view.prompt.num_options].argsort(descending=True).tolist()
                safe = [o for o in ranked if not crashes(view, view.prompt.action_index(o))]
                if safe:
                    options[row] = safe[0]
            self.vetoes[id(view.episode)] = used + 1
        return options, logps, entropies, values


def load_policy(path: str):
    tokenizer = load_tokenizer(path)
    return load_causal_lm(path, trainable=False).eval(), tokenizer, OptionHead(tokenizer)


def crash_action_probability(path: str, failures: list[Episode]) -> float:
    """Mean probability the policy at ``path`` gives the action that ended each failed episode, at its last turn."""
    model, tokenizer, head = load_policy(path)
    probs = []
    for episode in failures:
        turn = episode.turns[-1]
        prompt = build_prompt(turn.state_text, turn.actions, turn.reflection, labels=head.labels)
        input_ids, mask = left_pad(encode_prompts(tokenizer, [prompt.text]), tokenizer.pad_token_id)
        with torch.no_grad():
            log_probs = head.log_probs(model, input_ids, mask, torch.tensor([prompt.num_options]))[0]
        probs.append(log_probs.exp()[prompt.option_of(turn.action_index)].item())
    return sum(probs) / max(len(probs), 1)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", required=True, help="the Reflect policy analysed (e.g. the SFT'd one)")
    parser.add_argument("--reflection", required=True, help="its reflection model (greedy reflections)")
    parser.add_argument(
        "--compare", nargs="*", default=[], help="policies scored on --policy's failing turns"
    )
    parser.add_argument("--split", default="validation")
    parser.add_argument("--episodes", type=int, default=300, help="episodes per stage")
    parser.add_argument("--seed", type=int, default=777, help="seed of the held-out tasks")
    parser.add_argument("--output", default="outputs/bench/reflection_veto.json")
    args = parser.parse_args(argv)
    model, tokenizer, head = load_policy(args.policy)
    reflection = ReflectionModel(
        load_causal_lm(args.reflection, trainable=False), load_tokenizer(args.reflection), max_new_tokens=48,
        temperature=0.0,
    )  # fmt: skip
    settings = EvalSettings(split=args.split, seed=args.seed, episodes_per_stage=args.episodes)
    report: dict = {"policy": args.policy, "reflection": args.reflection, "split": args.split, "stages": {}}
    for stage in STAGES:
        tasks, seeds = eval_tasks(settings, stage)
        row: dict = {"episodes": len(tasks)}
        for name, mode, limit in [("plain", "none", 0), ("veto_oracle_1", "oracle", 1), ("veto_next_1", "next", 1),
                                  ("veto_next_all", "next", 10**6)]:  # fmt: skip
            episodes = RolloutEngine("taxi", VetoActor(model, tokenizer, head, mode, limit), reflection).run(
                tasks, seeds
            )
            row["success" if name == "plain" else name] = sum(e.success for e in episodes) / len(episodes)
            if name == "plain":
                plain = episodes
        turns = [t for e in plain for t in e.turns if recommended_action(t.reflection, t.actions) is not None]
        row["follows_reflection"] = sum(
            t.action_index == recommended_action(t.reflection, t.actions) for t in turns
        ) / max(len(turns), 1)
        failures = [e for e in plain if not e.success]
        row["failures"] = len(failures)
        row["failures_on_named_action"] = sum(
            e.turns[-1].action_index == recommended_action(e.turns[-1].reflection, e.turns[-1].actions)
            for e in failures
        )
        row["p_crash_action"] = {
            path: crash_action_probability(path, failures) for path in [args.policy, *args.compare]
        }
        report["stages"][stage] = row
        print(f"[veto] {stage}: {json.dumps(row)}", flush=True)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"[veto] wrote {out}")
    return report


if __name__ == "__main__":
    main()
