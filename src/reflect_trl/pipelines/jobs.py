"""A small job graph for multi-step runs (the demo): ``reflect-trl`` commands with dependencies, run one after the
other in this process, or by a pool of worker processes (one process per job, one torch thread each: on a small CPU
machine two single-threaded jobs finish sooner than two two-threaded jobs in a row).

Worker processes are forked from a fork server that has imported torch, transformers, TRL and every command's module
once (:func:`preload_modules`), so a job does not pay the ~10 s of imports each. Outside Linux, or on a machine with CUDA
(:func:`fork_server_usable`), each job is a ``python -m reflect_trl.cli`` subprocess.

Jobs start in list order as soon as what they need is done, so list the long chains first.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Job:
    """One ``reflect-trl <command> <argv>`` step; ``needs`` names the jobs that must finish first; ``env`` adds
    environment variables (e.g. ``WANDB_DIR``); ``log`` is where a worker process writes its output (default:
    ``log_dir/<name>.log``). A forked worker sets ``env`` after the fork server's imports: a variable that a library
    reads when it is imported belongs in the environment of the process that calls :func:`run_jobs`. ``after`` runs in
    the process that calls :func:`run_jobs` once the job has succeeded, before a job that needs it starts (e.g. to
    collect what the job wrote)."""

    name: str
    command: str
    argv: list[str]
    needs: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    log: Path | None = None
    #: the folder the job fills (a run directory, a data set): a job that finished there before with the same
    #: command line is reused instead of run again (:func:`run_jobs`' ``reuse``)
    output: Path | None = None
    after: Callable[[], None] | None = None


DONE_MARKER = ".reflect_trl_job.json"


def _marker(job: Job) -> dict[str, Any]:
    from reflect_trl import __version__

    return {"command": job.command, "argv": [str(a) for a in job.argv], "reflect_trl": __version__}


def finished_before(job: Job) -> bool:
    """Whether ``job.output`` holds a finished run of this very job (same command line and reflect-trl version)."""
    if job.output is None:
        return False
    try:
        return json.loads((Path(job.output) / DONE_MARKER).read_text()) == _marker(job)
    except (OSError, ValueError):
        return False


def mark_finished(job: Job) -> None:
    """Record a succeeded job in its ``output`` folder, then run its ``after``."""
    if job.output is not None and Path(job.output).is_dir():
        (Path(job.output) / DONE_MARKER).write_text(json.dumps(_marker(job)) + "\n")
    if job.after is not None:
        job.after()


class JobFailed(RuntimeError):
    """A job of the graph failed; the message names it and its log."""


def _exit_on_sigterm(signum: int, frame) -> None:
    raise SystemExit(128 + signum)  # the shell's status for "killed by signal signum"


@contextlib.contextmanager
def _sigterm_raises():
    """While the block runs, SIGTERM (``kill``, a batch system's stop) raises ``SystemExit(143)`` in the main thread
    instead of ending the process on the spot, so ``finally`` clauses run and stop the worker processes: without
    it the workers (children of the fork server, or subprocesses) outlive a killed parent and keep the cores busy.
    Outside the main thread (where Python cannot handle signals) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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


@contextlib.contextmanager
def _environment(variables: dict[str, str]):
    """``os.environ`` with ``variables`` set, restored afterwards."""
    saved = {k: os.environ.get(k) for k in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _in_process(job: Job) -> None:
    from reflect_trl.cli import main

    with _environment(job.env):
        code = main([job.command, *job.argv])
    if code:
        raise JobFailed(f"job {job.name!r} (reflect-trl {job.command}) failed with exit status {code}")


def preload_modules() -> list[str]:
    """What the fork server imports before it forks the first job: the CLI's setup (``reflect_trl.pipelines._fork_server_init``),
    torch, transformers, TRL and the module of every ``reflect-trl`` command."""
    from reflect_trl.cli import COMMANDS

    commands = sorted({t.partition(":")[0] for _, t in COMMANDS.values()})
    return [
        "reflect_trl.pipelines._fork_server_init",
        "torch",
        "transformers",
        "trl",
        "reflect_trl.pipelines.jobs",
        *commands,
        # the command modules import their trainers when they run
        "reflect_trl.trainers.rl_trainer",
        "reflect_trl.trainers.sft_trainer",
    ]


#: The environment of every worker process (besides the job's own ``env``), and of the fork server: one thread, no
#: progress bars (workers run with ``--no-progress``; huggingface_hub and datasets read their switches at import).
WORKER_ENV = {
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
}


def fork_server_usable() -> bool:
    """Whether jobs may be forked from a preloaded server: on Linux (macOS's system frameworks are not fork-safe, which
    is why Python spawns there; Windows has no fork) without a CUDA device. With CUDA they stay subprocesses:
    bitsandbytes asks ``torch.cuda.is_available()`` when it is imported, which initializes CUDA in the server, and a
    process forked after that cannot use CUDA."""
    if not sys.platform.startswith("linux") or "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    import torch

    return not torch.cuda.is_available()


def _start_fork_server() -> multiprocessing.context.BaseContext | None:
    """The ``forkserver`` context with :func:`preload_modules` imported in the server (started now, so its imports are not
    counted in the first job's time). The server starts with :data:`WORKER_ENV` in its environment (OpenMP reads its
    thread count when torch is imported there)."""
    from multiprocessing import forkserver

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(preload_modules())
    with _environment(WORKER_ENV):
        forkserver.ensure_running()
    return context


def _forked_job(argv: list[str], env: dict[str, str], log: str) -> None:
    """The body of a forked worker: the job's environment, its output into ``log``, ``reflect-trl <argv>``."""
    os.environ.update(env)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    import torch

    torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    from reflect_trl.cli import main

    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


class _Worker:
    """A running job: a forked :class:`multiprocessing.Process` or a subprocess, with one interface."""

    def __init__(self, context, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.process = self.popen = self.log = None
        if context is not None:
            self.process = context.Process(target=_forked_job, args=(argv, env, str(log)), daemon=False)
            self.process.start()
        else:
            self.log = open(log, "w")  # noqa: SIM115 (closed when the job ends)
            cmd = [sys.executable, "-m", "reflect_trl.cli", *argv]
            self.popen = subprocess.Popen(
                cmd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **env}
            )

    def returncode(self) -> int | None:
        """The exit status, ``None`` while the job runs."""
        if self.process is not None:
            return self.process.exitcode
        return self.popen.poll()

    def close(self) -> None:
        if self.process is not None:
            self.process.join()
        if self.log is not None:
            self.log.close()

    def stop(self) -> None:
        if self.process is not None:
            if self.process.exitcode is None:
                self.process.terminate()
            self.process.join()
        else:
            self.popen.terminate()
            self.popen.wait()
        self.close()


def run_jobs(
    jobs: Sequence[Job],
    workers: int = 1,
    log_dir: str | Path | None = None,
    report: Callable[[str, str, float], None] | None = None,
    fork_server: bool | None = None,
    reuse: bool = False,
) -> dict[str, float]:
    """Run the graph; returns each job's wall time in seconds. ``workers`` 1: in this process, in list order;
    more: that many worker processes at a time, their output in ``log_dir/<job>.log``, forked from a preloaded server
    (``fork_server``; default: :func:`fork_server_usable`) or else ``python -m reflect_trl.cli`` subprocesses.
    ``report(job, event, seconds)`` is called with ``"start"`` and ``"done"`` (``"reused"`` for a job that
    ``reuse`` skips: it finished in its ``output`` before with the same command line). The first failure stops the
    others and raises :class:`JobFailed`; SIGTERM or Ctrl-C stops them too (``SystemExit(143)`` /
    ``KeyboardInterrupt``)."""
    check_graph(jobs)
    report = report or (lambda name, event, seconds: None)
    timings: dict[str, float] = {}
    if reuse:
        for job in jobs:
            if finished_before(job):
                timings[job.name] = 0.0
                report(job.name, "reused", 0.0)
        jobs = [job for job in jobs if job.name not in timings]
    if workers <= 1:
        for job in jobs:
            report(job.name, "start", 0.0)
            t0 = time.perf_counter()
            _in_process(job)
            mark_finished(job)
            timings[job.name] = time.perf_counter() - t0
            report(job.name, "done", timings[job.name])
        return timings
    if log_dir is None and any(job.log is None for job in jobs):
        raise ValueError("run_jobs with several workers needs a log_dir (or a log for every job)")
    logs = {job.name: Path(job.log) if job.log else Path(log_dir) / f"{job.name}.log" for job in jobs}
    for path in logs.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    pending = list(jobs)
    if fork_server is None:
        fork_server = fork_server_usable()
    context = _start_fork_server() if fork_server else None
    running: dict[str, tuple[_Worker, float]] = {}
    with _sigterm_raises():
        try:
            while pending or running:
                ready = [j for j in pending if all(n in timings for n in j.needs)]
                while ready and len(running) < workers:
                    job = ready.pop(0)
                    pending.remove(job)
                    argv = ["--no-progress", job.command, *job.argv]
                    worker = _Worker(context, argv, {**WORKER_ENV, **job.env}, logs[job.name])
                    running[job.name] = (worker, time.perf_counter())
                    report(job.name, "start", 0.0)
                if not running:
                    raise JobFailed(f"jobs {[j.name for j in pending]} wait for jobs that never ran")
                time.sleep(0.5)
                for name, (worker, t0) in list(running.items()):
                    code = worker.returncode()
                    if code is None:
                        continue
                    worker.close()
                    del running[name]
                    if code:
                        raise JobFailed(f"job {name!r} failed with exit status {code}; see {logs[name]}")
                    mark_finished(next(j for j in jobs if j.name == name))
                    timings[name] = time.perf_counter() - t0
                    report(name, "done", timings[name])
        finally:
            for worker, _ in running.values():
                worker.stop()
    return timings


__all__ = [
    "WORKER_ENV",
    "fork_server_usable",
    "preload_modules",
    "Job",
    "JobFailed",
    "check_graph",
    "run_jobs",
]
