"""Rollout throughput: the two-player rollout against a naive loop and against the bare-model limit.

For each batch size ``B`` the same ``B`` episodes (DangerousTaxi ``full`` tasks, fixed seeds) are played by

* **ours**: :class:`~reflect_trl.rollout.RolloutEngine` with a :class:`~reflect_trl.reflection.model.ReflectionModel`
  and a :class:`~reflect_trl.rollout.PolicyActor` (lock-step, one batched generate + one policy forward per turn);
* **naive**: one episode at a time, one ``model.generate`` per reflection, one policy forward per action -- the
  loop a user writes first;
* **limit**: the bare models only -- per turn one batched ``generate`` of exactly ``reflection_tokens`` new tokens
  (no stop) on pre-padded tensors of the rollout's own reflection prompts, plus one batched policy forward on the
  rollout's own policy prompts; no environment, no tokenizer, no bookkeeping. It replays as many turns, with the
  same live batch sizes, as the rollout took.

Fairness: every turn of every method has a budget of ``reflection_tokens`` tokens (the limit generates exactly
that many; an untrained model seldom writes the stop marker, and the actual counts are reported), and episodes last ``--turns`` turns because the benchmark
plays a *forgiving* DangerousTaxi in which a no-effect action costs a step instead of ending the episode (an
untrained policy would otherwise crash on the first step and the batch would empty after one or two turns).
Costs are compared per env-step (turn): env-steps/s = turns played / wall time.

Run: ``python benchmarks/rollout_throughput.py [--model_name_or_path DIR] [--batch_sizes 1,8,32] [--repeats 5]
[--reflection_tokens 32] [--output outputs/bench/rollout.json]`` (``make bench ARGS="..."``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from reflect_trl.action_head import OptionHead
from reflect_trl.batching import left_pad, position_ids_from_mask
from reflect_trl.envs import Task, make_env, register_env
from reflect_trl.envs.taxi import DangerousTaxiEnv
from reflect_trl.prompts import build_prompt, clean_reflection, reflection_prompt
from reflect_trl.reflection.model import ReflectionModel, stop_token_ids
from reflect_trl.rollout import PolicyActor, RolloutEngine
from reflect_trl.tiny_models import PRESETS

BENCH_ENV = "taxi_forgiving_bench"
METHODS = ("ours", "naive", "limit")


class ForgivingTaxiEnv(DangerousTaxiEnv):
    """DangerousTaxi where a no-effect action wastes a step instead of ending the episode (benchmark only).

    Observations, actions and per-step work are those of DangerousTaxi; only the crash no longer terminates, so
    episodes of an untrained policy last the whole horizon and batches stay full.
    """

    def step(self, action_index: int):
        obs, reward, terminated, truncated, info = super().step(action_index)
        if info["crash"]:
            self.crashed = info["crash"] = False
            terminated = False
            truncated = self.t >= self.horizon
            self.done = truncated
        return obs, reward, terminated, truncated, info


register_env(BENCH_ENV, ForgivingTaxiEnv)


# ------------------------------------------------------------------------------------------------ setup
@dataclass
class Players:
    """The two models and the shared tokenizer of one benchmark run."""

    reflection_model: Any
    policy_model: Any
    tokenizer: Any
    option_head: OptionHead
    model_dir: str
    device: torch.device

    def params(self) -> dict[str, int]:
        return {
            "reflection": sum(p.numel() for p in self.reflection_model.parameters()),
            "policy": sum(p.numel() for p in self.policy_model.parameters()),
        }


def load_players(model_dir: str, device: str = "cpu") -> Players:
    """Load the checkpoint twice (frozen reflection player, policy player) with one tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    dev = torch.device(device)
    reflection = AutoModelForCausalLM.from_pretrained(model_dir).to(dev).eval()
    policy = AutoModelForCausalLM.from_pretrained(model_dir).to(dev).eval()
    return Players(reflection, policy, tokenizer, OptionHead(tokenizer), model_dir, dev)


def make_bench_tasks(n: int, seed: int) -> list[Task]:
    """``n`` DangerousTaxi ``full`` tasks (test split), the same for every method."""
    return make_env("taxi").make_tasks("test", n, seed=seed, difficulty="full")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """Wall-clock and process CPU time of a block (device work synchronised at both ends)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds = self.cpu_seconds = 0.0

    def __enter__(self) -> Stopwatch:
        synchronize(self.device)
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        synchronize(self.device)
        self.seconds = time.perf_counter() - self._wall
        self.cpu_seconds = time.process_time() - self._cpu


# ------------------------------------------------------------------------------------------------ methods
@dataclass
class RunResult:
    """One timed run of one method."""

    seconds: float  # wall clock
    cpu_seconds: float  # CPU time of the process (all threads): robust to other load on a shared machine
    env_steps: int
    reflection_tokens: int
    turn_batch_sizes: list[int] = field(default_factory=list)
    breakdown: dict[str, float] = field(default_factory=dict)


def run_ours(
    players: Players, tasks: Sequence[Task], reflection_tokens: int, turns: int
) -> tuple[RunResult, list]:
    """The lock-step rollout engine (what training and evaluation use)."""
    reflection = ReflectionModel(
        players.reflection_model, players.tokenizer, max_new_tokens=reflection_tokens, temperature=1.0
    )
    actor = PolicyActor(players.policy_model, players.tokenizer, players.option_head, temperature=1.0)
    engine = RolloutEngine(BENCH_ENV, actor, reflection, env_kwargs={"horizon": turns})
    with Stopwatch(players.device) as clock:
        episodes = engine.run(tasks)
    steps = sum(ep.length for ep in episodes)
    tokens = sum(t.reflection_tokens for ep in episodes for t in ep.turns)
    batch_sizes = [sum(ep.length > k for ep in episodes) for k in range(max(ep.length for ep in episodes))]
    timings = engine.timings.as_dict()
    breakdown = {k: float(v) for k, v in timings.items() if k.endswith("_s")}
    return RunResult(clock.seconds, clock.cpu_seconds, steps, tokens, batch_sizes, breakdown), episodes


@torch.inference_mode()
def run_naive(players: Players, tasks: Sequence[Task], reflection_tokens: int, turns: int) -> RunResult:
    """One episode at a time; per step one single-prompt ``generate`` and one policy forward."""
    tok, refl, policy = players.tokenizer, players.reflection_model, players.policy_model
    label_ids = players.option_head.label_ids.to(players.device)
    eos = stop_token_ids(tok) or tok.eos_token_id
    steps = tokens = 0
    with Stopwatch(players.device) as clock:
        for task in tasks:
            env = make_env(BENCH_ENV, horizon=turns)
            obs = env.reset(seed=task.seed, task=task)
            done = False
            while not done:
                enc = tok(reflection_prompt(obs.text), return_tensors="pt")
                enc = enc.to(players.device)
                out = refl.generate(
                    **enc,
                    max_new_tokens=reflection_tokens,
                    do_sample=True,
                    temperature=1.0,
                    top_k=0,
                    top_p=1.0,
                    eos_token_id=eos,
                    pad_token_id=tok.pad_token_id,
                )
                new = out[0, enc["input_ids"].shape[1] :]
                tokens += int(new.shape[0])
                reflection = clean_reflection(tok.decode(new))
                prompt = build_prompt(obs.text, obs.actions, reflection)
                enc = tok(prompt.text, return_tensors="pt").to(players.device)
                logits = policy(**enc).logits[0, -1]
                label_logits = logits[label_ids[: prompt.num_options]]
                option = int(torch.multinomial(torch.softmax(label_logits.float(), -1), 1))
                obs, _, terminated, truncated, _ = env.step(prompt.action_index(option))
                done = terminated or truncated
                steps += 1
    return RunResult(clock.seconds, clock.cpu_seconds, steps, tokens)


@dataclass
class LimitTurn:
    """Pre-built tensors of one turn for the bare-model limit."""

    reflection_ids: torch.Tensor
    reflection_mask: torch.Tensor
    policy_ids: torch.Tensor
    policy_mask: torch.Tensor
    policy_positions: torch.Tensor


def limit_inputs(players: Players, episodes: list) -> list[LimitTurn]:
    """The rollout's own prompts, turn by turn, tokenised and left-padded once (outside the timing)."""
    tok = players.tokenizer
    out = []
    for k in range(max(ep.length for ep in episodes)):
        turns = [ep.turns[k] for ep in episodes if ep.length > k]
        refl = tok([reflection_prompt(t.state_text) for t in turns])["input_ids"]
        r_ids, r_mask = left_pad(refl, tok.pad_token_id)
        p_ids, p_mask = left_pad([t.prompt_ids for t in turns], tok.pad_token_id)
        dev = players.device
        out.append(
            LimitTurn(
                r_ids.to(dev),
                r_mask.to(dev),
                p_ids.to(dev),
                p_mask.to(dev),
                position_ids_from_mask(p_mask).to(dev),
            )
        )
    return out


@torch.inference_mode()
def run_limit(players: Players, inputs: list[LimitTurn], reflection_tokens: int) -> RunResult:
    """Bare models: per turn one batched fixed-length generate and one batched policy forward."""
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=reflection_tokens,
        min_new_tokens=reflection_tokens,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        eos_token_id=None,
        pad_token_id=players.tokenizer.pad_token_id,
        use_cache=True,
    )
    label_ids = players.option_head.label_ids.to(players.device)
    steps = tokens = 0
    with Stopwatch(players.device) as clock:
        for turn in inputs:
            out = players.reflection_model.generate(
                input_ids=turn.reflection_ids, attention_mask=turn.reflection_mask, generation_config=config
            )
            tokens += out.shape[0] * (out.shape[1] - turn.reflection_ids.shape[1])
            logits = players.policy_model(
                input_ids=turn.policy_ids,
                attention_mask=turn.policy_mask,
                position_ids=turn.policy_positions,
                logits_to_keep=1,
                use_cache=False,
            ).logits[:, -1, :]
            torch.multinomial(torch.softmax(logits.index_select(-1, label_ids).float(), -1), 1)
            steps += turn.policy_ids.shape[0]
    batch_sizes = [t.policy_ids.shape[0] for t in inputs]
    return RunResult(clock.seconds, clock.cpu_seconds, steps, tokens, batch_sizes)


# ------------------------------------------------------------------------------------------------ benchmark
def summarize(runs: list[RunResult]) -> dict[str, float]:
    """Medians over repetitions: wall time, CPU time, per env-step costs and throughputs."""
    per_step = statistics.median(r.seconds / max(r.env_steps, 1) for r in runs)
    cpu_per_step = statistics.median(r.cpu_seconds / max(r.env_steps, 1) for r in runs)
    return {
        "median_seconds": statistics.median(r.seconds for r in runs),
        "median_cpu_seconds": statistics.median(r.cpu_seconds for r in runs),
        "median_seconds_per_step": per_step,
        "median_cpu_seconds_per_step": cpu_per_step,
        "env_steps_per_s": 1.0 / per_step,
        "env_steps_per_cpu_s": 1.0 / cpu_per_step,
        "reflection_tokens_per_s": statistics.median(r.reflection_tokens / r.seconds for r in runs),
        "mean_reflection_tokens_per_step": statistics.mean(
            r.reflection_tokens / max(r.env_steps, 1) for r in runs
        ),
    }


def paired_ratio(a: list[RunResult], b: list[RunResult], key: str) -> float:
    """Median over repetitions of (per-step cost of a) / (per-step cost of b), runs paired by repetition."""
    return statistics.median(
        (getattr(x, key) / max(x.env_steps, 1)) / (getattr(y, key) / max(y.env_steps, 1))
        for x, y in zip(a, b, strict=True)
    )


def bench_batch_size(players: Players, batch_size: int, args: argparse.Namespace, log) -> dict[str, Any]:
    """Warm-up, then ``repeats`` timed runs of every method on the same ``batch_size`` episodes.

    The three methods run back to back inside each repetition, so slow phases of a shared machine hit them alike.
    """
    tasks = make_bench_tasks(batch_size, args.seed)
    raw: dict[str, list[RunResult]] = {m: [] for m in METHODS}
    for rep in range(-1, args.repeats):  # rep -1 is the warm-up
        torch.manual_seed(args.seed + rep)
        ours, episodes = run_ours(players, tasks, args.reflection_tokens, args.turns)
        torch.manual_seed(args.seed + rep)
        naive = run_naive(players, tasks, args.reflection_tokens, args.turns)
        inputs = limit_inputs(players, episodes)
        torch.manual_seed(args.seed + rep)
        limit = run_limit(players, inputs, args.reflection_tokens)
        if rep >= 0:
            for name, res in zip(METHODS, (ours, naive, limit), strict=True):
                raw[name].append(res)
        log(
            f"  batch {batch_size} {'warm-up' if rep < 0 else f'rep {rep + 1}/{args.repeats}'}: "
            f"ours {ours.seconds:.3f}s (cpu {ours.cpu_seconds:.3f}) naive {naive.seconds:.3f}s "
            f"(cpu {naive.cpu_seconds:.3f}) limit {limit.seconds:.3f}s (cpu {limit.cpu_seconds:.3f}), "
            f"{ours.env_steps} env-steps"
        )
    summary = {m: summarize(raw[m]) for m in METHODS}

    def ratio(a: str, b: str, key: str) -> float:
        return summary[a][key] / summary[b][key]

    return {
        "batch_size": batch_size,
        **summary,
        # speed-up = naive time per step / our time per step; limit ratio = our time per step / limit time per step
        "ours_over_naive_speedup": ratio("naive", "ours", "median_seconds_per_step"),
        "ours_over_limit_time": ratio("ours", "limit", "median_seconds_per_step"),
        "ours_over_naive_speedup_cpu": ratio("naive", "ours", "median_cpu_seconds_per_step"),
        "ours_over_limit_time_cpu": ratio("ours", "limit", "median_cpu_seconds_per_step"),
        "paired_ours_over_limit_time": paired_ratio(raw["ours"], raw["limit"], "seconds"),
        "paired_ours_over_limit_time_cpu": paired_ratio(raw["ours"], raw["limit"], "cpu_seconds"),
        "raw": {m: [r.__dict__ for r in raw[m]] for m in METHODS},
    }


# Where the time of one rollout goes: cProfile (process CPU time) grouped into phases, plus the top torch ops.
PROFILE_PHASES: dict[str, tuple[str, str]] = {
    # phase: (file suffix, function name) whose cumulative time is the phase
    "reflection: generate (total)": ("generation/utils.py", "generate"),
    "reflection: prefill of the suffixes": ("generation/utils.py", "_prefill"),
    "shared-prefix KV encoding (both players)": ("reflect_trl/batching.py", "prefix_kv_cache"),
    "reflection: decode (sampling loop)": ("generation/utils.py", "_sample"),
    "policy: forward + option head": ("reflect_trl/rollout.py", "act"),
    "tokenization (all)": ("tokenization_utils_base.py", "__call__"),
    "detokenization": ("tokenization_utils_base.py", "decode"),
    "environment steps": ("reflect_trl/envs/taxi.py", "step"),
}


def profile_ours(players: Players, batch_size: int, args: argparse.Namespace) -> dict[str, Any]:
    """Profile one (warm) rollout of ``batch_size`` episodes: phases and top operators by CPU time."""
    import cProfile
    import pstats

    from torch.profiler import ProfilerActivity, profile

    tasks = make_bench_tasks(batch_size, args.seed)
    run_ours(players, tasks, args.reflection_tokens, args.turns)  # warm
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    run_ours(players, tasks, args.reflection_tokens, args.turns)
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (cc, nc, tottime, cumtime, callers)
    total = sum(v[2] for v in stats.values())
    phases: dict[str, float] = {}
    for phase, (suffix, name) in PROFILE_PHASES.items():
        phases[phase] = sum(v[3] for k, v in stats.items() if k[0].endswith(suffix) and k[2] == name)
    # _sample's cumulative time includes the prefill: report the decode loop alone.
    phases["reflection: decode (sampling loop)"] -= phases["reflection: prefill of the suffixes"]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run_ours(players, tasks, args.reflection_tokens, args.turns)
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    op_total = sum(e.self_cpu_time_total for e in prof.key_averages()) or 1.0
    return {
        "batch_size": batch_size,
        "cpu_seconds": total,
        "phases_cpu_seconds": phases,
        "phases_share": {k: v / total for k, v in phases.items()},
        "top_ops": [
            {"op": e.key, "calls": e.count, "self_cpu_share": e.self_cpu_time_total / op_total}
            for e in ops[:12]
        ],
    }


def format_profile(report: dict[str, Any]) -> str:
    lines = [f"profile of one rollout, batch {report['batch_size']} ({report['cpu_seconds']:.2f} s CPU):"]
    for phase, share in report["phases_share"].items():
        lines.append(f"  {phase:<52} {100 * share:5.1f}%")
    lines.append("  top torch ops by self CPU time:")
    for op in report["top_ops"][:8]:
        lines.append(f"    {op['op']:<50} {100 * op['self_cpu_share']:5.1f}%  ({op['calls']} calls)")
    return "\n".join(lines)


def machine_info(players: Players) -> dict[str, Any]:
    import transformers

    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "device": str(players.device),
        "model_dir": players.model_dir,
        "model_params": players.params(),
        "model_config": {
            k: getattr(players.reflection_model.config, k, None)
            for k in ("model_type", "n_embd", "n_layer", "hidden_size", "num_hidden_layers", "vocab_size")
            if getattr(players.reflection_model.config, k, None) is not None
        },
    }
    if players.device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(players.device)
    return info


COLUMNS = (
    "batch",
    "ours steps/s",
    "naive steps/s",
    "limit steps/s",
    "ours/naive",
    "ours/limit",
    "refl tok/s",
    "ours/naive cpu",
    "ours/limit cpu",
)


def format_table(results: list[dict[str, Any]]) -> str:
    """Plain-text table: env-steps/s (wall), speed-up over naive (x), time ratio to the limit, reflection
    tokens/s of ours, and the two ratios again on process CPU time."""
    rows = [COLUMNS]
    for r in results:
        rows.append(
            (
                str(r["batch_size"]),
                f"{r['ours']['env_steps_per_s']:.1f}",
                f"{r['naive']['env_steps_per_s']:.1f}",
                f"{r['limit']['env_steps_per_s']:.1f}",
                f"{r['ours_over_naive_speedup']:.2f}x",
                f"{r['ours_over_limit_time']:.2f}",
                f"{r['ours']['reflection_tokens_per_s']:.0f}",
                f"{r['ours_over_naive_speedup_cpu']:.2f}x",
                f"{r['ours_over_limit_time_cpu']:.2f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def parse_batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"--batch_sizes must be comma-separated integers, got {text!r}"
        ) from exc
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--batch_sizes needs positive integers, got {text!r}")
    return sizes


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model_name_or_path", default=None, help="checkpoint for both players (default: a fresh tiny model)"
    )
    p.add_argument(
        "--tiny_preset",
        default="tiny",
        choices=sorted(PRESETS),
        help="preset of the tiny model built when no path is given",
    )
    p.add_argument("--tiny_arch", default="gpt2", choices=("gpt2", "llama"))
    p.add_argument("--batch_sizes", type=parse_batch_sizes, default=[1, 8, 32])
    p.add_argument(
        "--repeats", type=int, default=5, help="timed repetitions after one warm-up (median reported)"
    )
    p.add_argument("--reflection_tokens", type=int, default=32, help="reflection token budget per turn")
    p.add_argument("--turns", type=int, default=8, help="turns per episode (horizon of the forgiving taxi)")
    p.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)"
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default="outputs/bench/rollout.json")
    p.add_argument(
        "--profile", action="store_true", help="also profile one rollout at the largest batch size"
    )
    return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the table, write the JSON; returns the JSON record."""
    args = build_parser().parse_args(argv)
    if args.repeats < 1 or args.reflection_tokens < 1 or args.turns < 1:
        raise SystemExit("--repeats, --reflection_tokens and --turns must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    # The fast tokenizer's own thread pool would compete with torch for the cores (the test suite does the same).
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="reflect-bench-") as tmp:
        model_dir = args.model_name_or_path
        if model_dir is None:
            from reflect_trl.tiny_models import build_tiny_model

            log(f"building a tiny {args.tiny_arch} model (preset {args.tiny_preset}) in {tmp}")
            model_dir = str(
                build_tiny_model(tmp, arch=args.tiny_arch, preset=args.tiny_preset, seed=args.seed)
            )
        players = load_players(model_dir, args.device)
        info = machine_info(players)
        if args.model_name_or_path is None:
            info["model_dir"] = f"<fresh tiny {args.tiny_arch} preset={args.tiny_preset} seed={args.seed}>"
        log(f"torch threads {info['torch_threads']}, params {info['model_params']}, device {info['device']}")
        results = [bench_batch_size(players, b, args, log) for b in args.batch_sizes]
        report = profile_ours(players, max(args.batch_sizes), args) if args.profile else None
    record = {
        "benchmark": "rollout_throughput",
        "settings": {k: v for k, v in vars(args).items()},
        "machine": info,
        "results": results,
        "profile": report,
    }
    print(format_table(results))
    if report is not None:
        print(format_profile(report))
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    return record


if __name__ == "__main__":
    main(sys.argv[1:])
