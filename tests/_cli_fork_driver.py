"""Run many ``reflect-trl`` command lines fast: import the CLI and its heavy dependencies once, then run each command
line in a forked child process, exactly as ``python -m reflect_trl.cli ARGV`` runs it (``sys.exit(main(ARGV))``; an
exception escaping ``main`` prints its traceback), with its own working directory, environment, stdout and stderr.

Usage: ``python tests/_cli_fork_driver.py cases.json`` where the file holds ``[{"argv": [...], "cwd": "...", "env":
{...}}, ...]``; prints ``[{"status": int, "stdout": str, "stderr": str}, ...]`` as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback

PARALLEL = 4


def _child(case: dict, out_path: str, err_path: str) -> None:
    """In the forked child: run the command line and exit with its status (never returns)."""
    try:
        os.chdir(case["cwd"])
        os.environ.update(case.get("env", {}))
        for fd, path in ((1, out_path), (2, err_path)):
            handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(handle, fd)
            os.close(handle)
        sys.stdout = open(1, "w", closefd=False, buffering=1)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False, buffering=1)  # noqa: SIM115
        from reflect_trl.cli import main

        try:
            code = main(list(case["argv"]))
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    except BaseException:  # the driver itself failed
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(99)


def run_cases(cases: list[dict]) -> list[dict]:
    tmp = tempfile.mkdtemp(prefix="cli_forks_")
    results: list[dict | None] = [None] * len(cases)
    running: dict[int, int] = {}
    pending = list(range(len(cases)))

    def reap() -> None:
        pid, status = os.wait()
        index = running.pop(pid)
        with open(f"{tmp}/{index}.out") as out, open(f"{tmp}/{index}.err") as err:
            results[index] = {
                "status": os.waitstatus_to_exitcode(status),
                "stdout": out.read(),
                "stderr": err.read(),
            }

    while pending or running:
        while pending and len(running) < PARALLEL:
            index = pending.pop(0)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(cases[index], f"{tmp}/{index}.out", f"{tmp}/{index}.err")
            running[pid] = index
        reap()
    return results  # type: ignore[return-value]


def main() -> None:
    with open(sys.argv[1]) as handle:
        cases = json.load(handle)
    # What `reflect-trl` imports for these commands, once (the children inherit it).
    from reflect_trl.quiet import quiet_dependencies

    quiet_dependencies()
    import reflect_trl.data.builder
    import reflect_trl.data.relabel
    import reflect_trl.evaluation
    import reflect_trl.pipelines.demo
    import reflect_trl.pipelines.plotting
    import reflect_trl.trainers.rl_trainer
    import reflect_trl.trainers.sft_trainer  # noqa: F401

    json.dump(run_cases(cases), sys.stdout)


if __name__ == "__main__":
    main()
