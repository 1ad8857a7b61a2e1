"""The demo's job graph: dependency order, worker processes, failures that name the job and its log."""

from __future__ import annotations

import sys

import pytest

from reflect_trl.pipelines.jobs import Job, JobFailed, check_graph, run_jobs


def test_graph_checks():
    with pytest.raises(ValueError, match="listed twice"):
        check_graph([Job("a", "envs", []), Job("a", "envs", [])])
    with pytest.raises(ValueError, match="needs \\['b'\\]"):
        check_graph([Job("a", "envs", [], needs=("b",)), Job("b", "envs", [])])


def test_in_process_runs_in_order(capsys):
    events = []
    timings = run_jobs(
        [Job("first", "envs", []), Job("second", "envs", [], needs=("first",))],
        workers=1,
        report=lambda name, event, seconds: events.append((name, event)),
    )
    assert events == [("first", "start"), ("first", "done"), ("second", "start"), ("second", "done")]
    assert set(timings) == {"first", "second"}
    assert "taxi" in capsys.readouterr().out  # `reflect-trl envs` really ran


HAS_FORK_SERVER = sys.platform.startswith("linux")
WORKER_KINDS = [
    pytest.param(
        True, id="forked", marks=pytest.mark.skipif(not HAS_FORK_SERVER, reason="no fork server here")
    ),
    pytest.param(False, id="subprocess"),
]


@pytest.mark.parametrize("fork_server", WORKER_KINDS)
def test_workers_respect_dependencies_and_write_logs(tmp_path, fork_server):
    events = []
    jobs = [
        Job("a", "envs", []),
        Job("b", "envs", []),
        Job("c", "envs", [], needs=("a", "b")),
    ]
    run_jobs(
        jobs,
        workers=2,
        log_dir=tmp_path,
        report=lambda name, event, seconds: events.append((name, event)),
        fork_server=fork_server,
    )
    assert events.index(("c", "start")) > max(events.index(("a", "done")), events.index(("b", "done")))
    assert {e for e in events if e[0] != "c"} == {
        ("a", "start"),
        ("b", "start"),
        ("a", "done"),
        ("b", "done"),
    }
    for name in "abc":
        assert "taxi" in (tmp_path / f"{name}.log").read_text()


@pytest.mark.parametrize("fork_server", WORKER_KINDS)
def test_a_failed_job_is_named_with_its_log(tmp_path, fork_server):
    jobs = [Job("bad", "envs", ["--no-such-flag"]), Job("after", "envs", [], needs=("bad",))]
    with pytest.raises(JobFailed, match=r"job 'bad' failed with exit status 2; see .*bad\.log"):
        run_jobs(jobs, workers=2, log_dir=tmp_path, fork_server=fork_server)
    assert "--no-such-flag" in (tmp_path / "bad.log").read_text()
    assert not (tmp_path / "after.log").exists()
    with pytest.raises(JobFailed, match="job 'bad'"):
        run_jobs(jobs, workers=1)


def test_a_job_may_name_its_own_log(tmp_path):
    jobs = [
        Job("a", "envs", [], log=tmp_path / "a" / "own.log"),
        Job("b", "envs", [], log=tmp_path / "b.txt"),
    ]
    run_jobs(jobs, workers=2)  # every job has its log: no log_dir needed
    assert "taxi" in (tmp_path / "a" / "own.log").read_text() and "taxi" in (tmp_path / "b.txt").read_text()
    with pytest.raises(ValueError, match="needs a log_dir"):
        run_jobs([Job("c", "envs", [])], workers=2)


def _probe_worker(path: str) -> None:
    """Runs in a forked worker: what it finds already imported, its torch threads and its environment."""
    import json
    import logging
    import os
    import sys

    preloaded = sorted(m for m in ("torch", "trl", "reflect_trl.trainers.rl_trainer") if m in sys.modules)
    import torch

    state = {
        "preloaded": preloaded,
        "threads": torch.get_num_threads(),
        "omp": os.environ.get("OMP_NUM_THREADS"),
        # read by huggingface_hub when the server imported it
        "hub_bars_off": __import__("huggingface_hub").constants.HF_HUB_DISABLE_PROGRESS_BARS,
        # reflect-trl's quiet_dependencies ran in the server before bitsandbytes was imported
        "bnb_notice_level": logging.getLogger("bitsandbytes.backends.cpu.ops").level,
    }
    with open(path, "w") as f:
        json.dump(state, f)


@pytest.mark.skipif(not HAS_FORK_SERVER, reason="no fork server here")
def test_workers_fork_from_a_server_that_imported_everything(tmp_path, monkeypatch):
    """A worker starts with torch, TRL and the trainers imported (no ~10 s of imports per job) and one torch thread;
    starting the server leaves the caller's environment as it was."""
    import json
    import logging
    import os

    from reflect_trl.pipelines.jobs import _start_fork_server, preload_modules

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    modules = preload_modules()
    assert modules[0] == "reflect_trl.pipelines._fork_server_init"  # before torch and the libraries it quiets
    assert {"torch", "trl", "reflect_trl.trainers.rl_trainer", "reflect_trl.trainers.sft_trainer"} <= set(
        modules
    )
    context = _start_fork_server()
    assert "OMP_NUM_THREADS" not in os.environ and "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ
    process = context.Process(target=_probe_worker, args=(str(tmp_path / "probe.json"),))
    process.start()
    process.join()
    assert process.exitcode == 0
    state = json.loads((tmp_path / "probe.json").read_text())
    assert state == {
        "preloaded": ["reflect_trl.trainers.rl_trainer", "torch", "trl"],
        "threads": 1,
        "omp": "1",
        "hub_bars_off": True,
        "bnb_notice_level": logging.ERROR,
    }


def test_no_fork_server_with_cuda(monkeypatch):
    """With CUDA the jobs are subprocesses: the server's imports (bitsandbytes) would initialize CUDA before forking."""
    import torch

    from reflect_trl.pipelines.jobs import fork_server_usable

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not fork_server_usable()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert fork_server_usable() == HAS_FORK_SERVER  # Linux only


def test_sigterm_to_the_parent_stops_the_workers(tmp_path):
    """`kill <parent>` (SIGTERM) stops the running jobs instead of leaving them to run on, and the parent exits with
    the shell's status for SIGTERM. The job is a subprocess whose interpreter start (a ``sitecustomize`` on its
    PYTHONPATH) records its pid and sleeps."""
    import os
    import signal
    import subprocess
    import time

    site = tmp_path / "site"
    site.mkdir()
    pid_file = tmp_path / "job.pid"
    (site / "sitecustomize.py").write_text(
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n"
    )
    python_path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    driver = (
        "from reflect_trl.pipelines.jobs import Job, run_jobs\n"
        f"run_jobs([Job('long', 'envs', [], env={{'PYTHONPATH': {python_path!r}}})], workers=2, "
        f"log_dir={str(tmp_path)!r}, fork_server=False)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", driver])
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    job_pid = int(pid_file.read_text())
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=30) == 128 + signal.SIGTERM
    with pytest.raises(ProcessLookupError):  # stopped and reaped by the parent, not left running
        os.kill(job_pid, 0)


def test_run_jobs_restores_the_sigterm_handler(tmp_path):
    import signal

    before = signal.getsignal(signal.SIGTERM)
    run_jobs([Job("a", "envs", [])], workers=2, log_dir=tmp_path, fork_server=False)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_job_that_finished_before_with_the_same_command_line_is_reused(tmp_path, capsys):
    from reflect_trl.pipelines.jobs import DONE_MARKER, Job, run_jobs

    out = tmp_path / "run"
    out.mkdir()
    events = []

    def report(name, event, seconds):
        events.append((name, event))

    jobs = [Job("listing", "envs", [], output=out), Job("after", "envs", [], needs=("listing",))]
    run_jobs(jobs, reuse=True, report=report)
    assert (out / DONE_MARKER).is_file()
    assert events == [("listing", "start"), ("listing", "done"), ("after", "start"), ("after", "done")]
    events.clear()
    run_jobs(jobs, reuse=True, report=report)
    assert events[0] == ("listing", "reused") and ("after", "done") in events  # no output: never reused
    events.clear()
    run_jobs([Job("listing", "envs", ["--help"], output=out)], reuse=True, report=report)
    assert events == [("listing", "start"), ("listing", "done")], "another command line runs again"
    events.clear()
    run_jobs(jobs[:1], reuse=False, report=report)
    assert events == [("listing", "start"), ("listing", "done")]
