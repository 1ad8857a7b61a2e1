"""A small job graph for multi-step runs (the demo): ``reflect-trl`` commands with dependencies, run one after the
other in this process, or by a pool of worker processes (one ``reflect-trl <command>`` subprocess per job, one torch
thread each: on a small CPU machine two single-threaded jobs finish sooner than two two-threaded jobs in a row).

Jobs start in list order as soon as what they need is done, so list the long chains first.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Job:
    """One ``reflect-trl <command> <argv>`` step; ``needs`` names the jobs that must finish first; ``env`` adds
    environment variables (e.g. ``WANDB_DIR``); ``log`` is where a worker process writes its output (default:
    ``log_dir/<name>.log``)."""

    name: str
    command: str
    argv: list[str]
    needs: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    log: Path | None = None


class JobFailed(RuntimeError):
    """A job of the graph failed; the message names it and its log."""


def check_graph(jobs: Sequence[Job]) -> None:
    """Unique names, known dependencies, no cycle (a job may only need jobs listed before it)."""
    seen: set[str] = set()
    for job in jobs:
        if job.name in seen:
            raise ValueError(f"job {job.name!r} is listed twice")
        unknown = [n for n in job.needs if n not in seen]
        if unknown:
            raise ValueError(f"job {job.name!r} needs {unknown}, which are not listed before it")
        seen.add(job.name)


def _in_process(job: Job) -> None:
    from reflect_trl.cli import main

    saved = {k: os.environ.get(k) for k in job.env}
    os.environ.update(job.env)
    try:
        code = main([job.command, *job.argv])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if code:
        raise JobFailed(f"job {job.name!r} (reflect-trl {job.command}) failed with exit status {code}")


def run_jobs(
    jobs: Sequence[Job],
    workers: int = 1,
    log_dir: str | Path | None = None,
    report: Callable[[str, str, float], None] | None = None,
) -> dict[str, float]:
    """Run the graph; returns each job's wall time in seconds. ``workers`` 1: in this process, in list order;
    more: that many subprocesses at a time, their output in ``log_dir/<job>.log``. ``report(job, event, seconds)`` is
    called with ``"start"`` and ``"done"``. The first failure stops the others and raises :class:`JobFailed`."""
    check_graph(jobs)
    report = report or (lambda name, event, seconds: None)
    timings: dict[str, float] = {}
    if workers <= 1:
        for job in jobs:
            report(job.name, "start", 0.0)
            t0 = time.perf_counter()
            _in_process(job)
            timings[job.name] = time.perf_counter() - t0
            report(job.name, "done", timings[job.name])
        return timings
    if log_dir is None and any(job.log is None for job in jobs):
        raise ValueError("run_jobs with several workers needs a log_dir (or a log for every job)")
    logs = {job.name: Path(job.log) if job.log else Path(log_dir) / f"{job.name}.log" for job in jobs}
    for path in logs.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    pending = list(jobs)
    running: dict[str, tuple[subprocess.Popen, object, float]] = {}
    base_env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    try:
        while pending or running:
            ready = [j for j in pending if all(n in timings for n in j.needs)]
            while ready and len(running) < workers:
                job = ready.pop(0)
                pending.remove(job)
                log = open(logs[job.name], "w")  # noqa: SIM115 (closed when the job ends)
                cmd = [sys.executable, "-m", "reflect_trl.cli", "--no-progress", job.command, *job.argv]
                proc = subprocess.Popen(
                    cmd, stdout=log, stderr=subprocess.STDOUT, env={**base_env, **job.env}
                )
                running[job.name] = (proc, log, time.perf_counter())
                report(job.name, "start", 0.0)
            if not running:
                raise JobFailed(f"jobs {[j.name for j in pending]} wait for jobs that never ran")
            time.sleep(0.5)
            for name, (proc, log, t0) in list(running.items()):
                if proc.poll() is None:
                    continue
                log.close()  # type: ignore[attr-defined]
                del running[name]
                if proc.returncode:
                    raise JobFailed(
                        f"job {name!r} failed with exit status {proc.returncode}; see {logs[name]}"
                    )
                timings[name] = time.perf_counter() - t0
                report(name, "done", timings[name])
    finally:
        for proc, log, _ in running.values():
            proc.terminate()
            proc.wait()
            log.close()  # type: ignore[attr-defined]
    return timings


__all__ = ["Job", "JobFailed", "check_graph", "run_jobs"]
