"""Rollout throughput with the reflection player behind a completions server vs in-process.

The same lock-step rollout (:class:`~reflect_trl.rollout.RolloutEngine`, the forgiving DangerousTaxi of
``rollout_throughput.py``, ``--turns`` turns per episode, a budget of ``--reflection_tokens`` sampled tokens per
reflection at temperature 1) is played with the reflection model

* **in-process**: :class:`~reflect_trl.reflection.model.ReflectionModel` in the rollout's process;
* **batched**: :class:`~reflect_trl.reflection.remote.RemoteReflectionModel`, one request per prompt, against a
  stdlib server in a subprocess that collects the prompts of concurrent requests and generates them together
  with the same ``ReflectionModel`` (``tests/reflection/_completions_server.py --batched``): what a batching engine
  such as vLLM does, so the difference to in-process is the cost of the protocol (HTTP, JSON, threads, the
  server's tokenization and a second process);
* **batched-list**: the same server, all prompts of a turn in one request (``prompts_per_request = B``);
* **transformers-serve**: ``transformers serve`` (no continuous batching: it generates one request at a time).

Both processes use ``--threads`` torch threads. Costs are per env-step (turns played / wall time); medians over
``--repeats`` repetitions after one warm-up; CPU time is recorded for the rollout process and for the server.

Run: ``python benchmarks/reflection_server_throughput.py [--batch_sizes 8,32] [--repeats 3]
[--backends in-process,batched,batched-list,transformers-serve] [--output outputs/bench/reflection_server.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

# the rollout benchmark beside this script (its forgiving taxi, task set, players, stopwatch)
import rollout_throughput as rt
from reflect_trl.reflection.model import ReflectionModel
from reflect_trl.reflection.remote import RemoteReflectionModel
from reflect_trl.reflection.serve import LOOPBACK, free_port, serve_command, serve_env, stop_server
from reflect_trl.rollout import PolicyActor, RolloutEngine

ROOT = Path(__file__).resolve().parents[1]

BACKENDS = ("in-process", "batched", "batched-list", "transformers-serve")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc); 0 where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class Server:
    """A reflection server subprocess: its base URL, model name and pid."""

    def __init__(self, base_url: str, model: str, pid: int | None) -> None:
        self.base_url, self.model, self.pid = base_url, model, pid

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.pid) if self.pid else 0.0


@contextmanager
def stdlib_server(model_dir: str, threads: int, start_timeout: float = 120.0) -> Iterator[Server]:
    """``_completions_server.py MODEL --batched`` in a subprocess; stopped afterwards."""
    port = free_port()
    script = ROOT / "tests" / "reflection" / "_completions_server.py"
    command = [
        sys.executable,
        str(script),
        model_dir,
        "--port",
        str(port),
        "--batched",
        "--threads",
        str(threads),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests" / "reflection"), "TOKENIZERS_PARALLELISM": "false"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in process.stdout], daemon=True).start()  # type: ignore[union-attr]
    try:
        deadline, seen = time.monotonic() + start_timeout, []
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(
                    f"the stdlib server did not start in {start_timeout}s: {''.join(seen)}"
                ) from None
            if line.startswith("ready "):
                break
            seen.append(line)
        yield Server(line.split()[1], "tiny", process.pid)
    finally:
        process.terminate()
        process.wait(timeout=10)


def wait_healthy(port: int, process: subprocess.Popen, timeout: float = 120.0) -> None:
    """Wait until the server on ``port`` answers ``/health`` (raises if it exits or times out)."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/health", timeout=1.0) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if process.poll() is not None:
            raise RuntimeError(f"transformers serve exited with status {process.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"transformers serve not up after {timeout:.0f} s")
        time.sleep(0.2)


@contextmanager
def serve(model_dir: str, threads: int) -> Iterator[Server]:
    """``transformers serve`` in a subprocess (OMP threads = ``threads``)."""
    previous = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        port = free_port()
        process = subprocess.Popen(
            serve_command(port, model_dir, "cpu"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=serve_env(),
        )
        try:
            wait_healthy(port, process)
            yield Server(f"http://{LOOPBACK}:{port}/v1", model_dir, process.pid)
        finally:
            stop_server(process)
    finally:
        if previous is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = previous


def run_rollout(players: rt.Players, reflection, tasks, turns: int, server: Server | None) -> dict[str, Any]:
    """One timed rollout of ``tasks`` with ``reflection``; wall and CPU time of both processes."""
    actor = PolicyActor(players.policy_model, players.tokenizer, players.option_head, temperature=1.0)
    engine = RolloutEngine(rt.BENCH_ENV, actor, reflection, env_kwargs={"horizon": turns})
    server_cpu = server.cpu_seconds() if server else 0.0
    with rt.Stopwatch(players.device) as clock:
        episodes = engine.run(tasks)
    steps = sum(ep.length for ep in episodes)
    return {
        "seconds": clock.seconds,
        "cpu_seconds": clock.cpu_seconds,
        "server_cpu_seconds": (server.cpu_seconds() - server_cpu) if server else 0.0,
        "env_steps": steps,
        "reflection_tokens": sum(t.reflection_tokens for ep in episodes for t in ep.turns),
        "reflection_seconds": engine.timings.reflection_s,
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, float]:
    def per_step(key: str) -> float:
        return statistics.median(r[key] / max(r["env_steps"], 1) for r in runs)

    wall = per_step("seconds")
    return {
        "env_steps_per_s": 1.0 / wall,
        "ms_per_step": 1000 * wall,
        "client_cpu_ms_per_step": 1000 * per_step("cpu_seconds"),
        "server_cpu_ms_per_step": 1000 * per_step("server_cpu_seconds"),
        "reflection_ms_per_step": 1000 * per_step("reflection_seconds"),
        "reflection_tokens_per_step": statistics.mean(
            r["reflection_tokens"] / max(r["env_steps"], 1) for r in runs
        ),
    }


def bench(
    name: str,
    make: Callable[[int], Any],
    players: rt.Players,
    args: argparse.Namespace,
    server: Server | None,
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Warm-up + ``repeats`` rollouts of ``name`` at every batch size."""
    out = []
    for batch_size in args.batch_sizes:
        tasks = rt.make_bench_tasks(batch_size, args.seed)
        runs = []
        reflection = make(batch_size)  # one player for all repetitions, as in a training run
        for rep in range(-1, args.repeats):
            torch.manual_seed(args.seed + rep)
            run = run_rollout(players, reflection, tasks, args.turns, server)
            if rep >= 0:
                runs.append(run)
            log(
                f"  {name} batch {batch_size} {'warm-up' if rep < 0 else f'rep {rep + 1}/{args.repeats}'}: "
                f"{run['seconds']:.3f}s (cpu {run['cpu_seconds']:.3f} + server {run['server_cpu_seconds']:.3f}), "
                f"{run['env_steps']} env-steps"
            )
        if isinstance(reflection, RemoteReflectionModel):
            reflection.close()
        out.append({"backend": name, "batch_size": batch_size, **summarize(runs), "raw": runs})
    return out


def format_table(results: list[dict[str, Any]]) -> str:
    reference = {r["batch_size"]: r for r in results if r["backend"] == "in-process"}
    columns = (
        "backend",
        "batch",
        "steps/s",
        "ms/step",
        "x in-proc time",
        "refl ms/step",
        "cpu ms/step (client+server)",
    )
    rows = [columns]
    for r in results:
        ref = reference.get(r["batch_size"])
        rows.append(
            (
                r["backend"],
                str(r["batch_size"]),
                f"{r['env_steps_per_s']:.1f}",
                f"{r['ms_per_step']:.2f}",
                f"{r['ms_per_step'] / ref['ms_per_step']:.2f}" if ref else "-",
                f"{r['reflection_ms_per_step']:.2f}",
                f"{r['client_cpu_ms_per_step']:.2f} + {r['server_cpu_ms_per_step']:.2f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def parse_backends(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = sorted(set(names) - set(BACKENDS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"--backends: unknown {unknown}; choose from {BACKENDS}")
    return names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model_name_or_path", default=None, help="checkpoint of both players (default: fresh tiny)"
    )
    p.add_argument("--tiny_preset", default="tiny", choices=sorted(rt.PRESETS))
    p.add_argument("--tiny_arch", default="llama", choices=("gpt2", "llama"))
    p.add_argument("--batch_sizes", type=rt.parse_batch_sizes, default=[8, 32])
    p.add_argument("--backends", type=parse_backends, default=list(BACKENDS))
    p.add_argument(
        "--repeats", type=int, default=3, help="timed repetitions after one warm-up (median reported)"
    )
    p.add_argument("--reflection_tokens", type=int, default=32)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the rollout and of the server")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default="outputs/bench/reflection_server.json")
    return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the table, write the JSON; returns the JSON record."""
    args = build_parser().parse_args(argv)
    if args.repeats < 1 or args.reflection_tokens < 1 or args.turns < 1:
        raise SystemExit("--repeats, --reflection_tokens and --turns must be >= 1")
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="reflect-bench-server-") as tmp:
        model_dir = args.model_name_or_path
        if model_dir is None:
            from reflect_trl.tiny_models import build_tiny_model

            log(f"building a tiny {args.tiny_arch} model (preset {args.tiny_preset}) in {tmp}")
            model_dir = str(
                build_tiny_model(tmp, arch=args.tiny_arch, preset=args.tiny_preset, seed=args.seed)
            )
        players = rt.load_players(model_dir)
        info = rt.machine_info(players)
        if args.model_name_or_path is None:
            info["model_dir"] = f"<fresh tiny {args.tiny_arch} preset={args.tiny_preset} seed={args.seed}>"
        info["load_average"] = os.getloadavg() if hasattr(os, "getloadavg") else None
        budget = args.reflection_tokens

        def remote(
            server: Server, per_request: Callable[[int], int]
        ) -> Callable[[int], RemoteReflectionModel]:
            return lambda b: RemoteReflectionModel(
                server.base_url,
                server.model,
                tokenizer=players.tokenizer,
                max_new_tokens=budget,
                temperature=1.0,
                concurrency=b,
                timeout=120.0,
                max_retries=0,
                prompts_per_request=per_request(b),
            )

        if "in-process" in args.backends:
            in_process = lambda b: ReflectionModel(  # noqa: E731
                players.reflection_model, players.tokenizer, max_new_tokens=budget, temperature=1.0
            )
            results += bench("in-process", in_process, players, args, None, log)
        if {"batched", "batched-list"} & set(args.backends):
            with stdlib_server(model_dir, args.threads) as server:
                if "batched" in args.backends:
                    results += bench("batched", remote(server, lambda b: 1), players, args, server, log)
                if "batched-list" in args.backends:
                    results += bench("batched-list", remote(server, lambda b: b), players, args, server, log)
        if "transformers-serve" in args.backends:
            with serve(model_dir, args.threads) as server:
                results += bench(
                    "transformers-serve", remote(server, lambda b: 1), players, args, server, log
                )
    record = {
        "benchmark": "reflection_server_throughput",
        "settings": {k: v for k, v in vars(args).items()},
        "machine": info,
        "results": results,
    }
    print(format_table(results))
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    return record


if __name__ == "__main__":
    main(sys.argv[1:])
