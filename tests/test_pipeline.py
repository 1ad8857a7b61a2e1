"""The demo's job graph: dependency order, worker processes, failures that name the job and its log."""

from __future__ import annotations

import pytest

from reflect_trl.pipeline import Job, JobFailed, check_graph, run_jobs


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


def test_workers_respect_dependencies_and_write_logs(tmp_path):
    events = []
    jobs = [
        Job("a", "envs", []),
        Job("b", "envs", []),
        Job("c", "envs", [], needs=("a", "b")),
    ]
    run_jobs(
        jobs, workers=2, log_dir=tmp_path, report=lambda name, event, seconds: events.append((name, event))
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


def test_a_failed_job_is_named_with_its_log(tmp_path):
    jobs = [Job("bad", "envs", ["--no-such-flag"]), Job("after", "envs", [], needs=("bad",))]
    with pytest.raises(JobFailed, match=r"job 'bad' failed with exit status 2; see .*bad\.log"):
        run_jobs(jobs, workers=2, log_dir=tmp_path)
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
    import os
    import sys

    preloaded = sorted(m for m in ("torch", "trl", "reflect_trl.trainers.rl") if m in sys.modules)
    import torch

    state = {
        "preloaded": preloaded,
        "threads": torch.get_num_threads(),
        "omp": os.environ.get("OMP_NUM_THREADS"),
    }
    with open(path, "w") as f:
        json.dump(state, f)


@pytest.mark.skipif(
    "forkserver" not in __import__("multiprocessing").get_all_start_methods(), reason="no fork server here"
)
def test_workers_fork_from_a_server_that_imported_everything(tmp_path, monkeypatch):
    """A worker starts with torch, TRL and the trainers imported (no ~10 s of imports per job) and one torch thread;
    starting the server leaves the caller's environment as it was."""
    import json
    import os

    from reflect_trl.pipeline import _start_fork_server, preload_modules

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert {"torch", "trl", "reflect_trl.trainers.rl", "reflect_trl.trainers.sft"} <= set(preload_modules())
    context = _start_fork_server()
    assert "OMP_NUM_THREADS" not in os.environ
    process = context.Process(target=_probe_worker, args=(str(tmp_path / "probe.json"),))
    process.start()
    process.join()
    assert process.exitcode == 0
    state = json.loads((tmp_path / "probe.json").read_text())
    assert state == {"preloaded": ["reflect_trl.trainers.rl", "torch", "trl"], "threads": 1, "omp": "1"}
