"""The pipelines' evaluation step (``demo``, ``reproduce``): reuse of earlier evaluations, and one evaluation job per
configuration.

**Reuse.** A configuration whose runs and evaluation settings are unchanged since it was last evaluated in the same
folder is not evaluated again. Its cache entry (``<eval dir>/cache/<configuration>.json``) holds its results and a
key: the evaluation settings, the configuration, and the job record (:data:`reflect_trl.pipelines.jobs.DONE_MARKER`:
command line and version, plus the time it was written) of every run it reads. A job that runs again rewrites its
record, so the entry no longer matches; a model without a job record (a hub id, a folder trained by hand) is always
evaluated. The entry is written after the configuration's transcripts, and an entry whose transcripts are gone is
evaluated again.

**Jobs.** :func:`configuration_job` is a ``reflect-trl eval`` job of one configuration that records its results in the
cache when it finishes, so a pipeline can put it in its training graph (it starts as soon as its runs are trained)
and then assemble the table from the cache. :func:`evaluate_in_workers` runs such jobs in a pool. Every
configuration's episodes are seeded per stage and decoding, so which process evaluates it changes no result. One
thing is not shared between jobs: the greedy reflection memo, so configurations that read the same reflection model
each generate their own reflections.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from reflect_trl import __version__
from reflect_trl.evaluation import (
    EvalConfiguration,
    EvalReport,
    EvalResult,
    EvalSettings,
    evaluate,
    safe_filename,
    transcript_key,
)
from reflect_trl.pipelines.jobs import DONE_MARKER, Job, run_jobs
from reflect_trl.scripted_actors import is_scripted_policy

CACHE_DIR = "cache"
WORK_DIR = "workers"  # under the eval dir: each worker's configurations, log and output


def job_record(model: str | None) -> dict[str, Any] | None:
    """The job record of the run that wrote ``model`` (the folder itself, or the run folder it lies in, e.g.
    ``rl_both/reflection``), with the time it was written; ``None`` when no pipeline job wrote it."""
    if model is None:
        return None
    path = Path(model)
    for folder in (path, path.parent):
        marker = folder / DONE_MARKER
        if marker.is_file():
            try:
                return {"job": json.loads(marker.read_text()), "written_ns": marker.stat().st_mtime_ns}
            except (OSError, ValueError):
                return None
    return None


def cache_key(configuration: EvalConfiguration, settings: EvalSettings) -> dict[str, Any] | None:
    """What an evaluation of ``configuration`` depends on; ``None`` when one of its models has no job record. A
    scripted policy (``oracle``, ``random``, ...) depends on no run, only on the code that plays it."""
    policy = (
        {"scripted": configuration.policy, "reflect_trl": __version__}
        if is_scripted_policy(configuration.policy)
        else job_record(configuration.policy)
    )
    records = {"policy": policy, "reflection": job_record(configuration.reflection)}
    if records["policy"] is None or (configuration.reflection is not None and records["reflection"] is None):
        return None
    # through JSON, so that a key read back from a file compares equal (tuples become lists)
    return json.loads(
        json.dumps({"settings": asdict(settings), "configuration": asdict(configuration), "runs": records})
    )


def transcript_files(eval_dir: Path, results: Sequence[dict[str, Any]]) -> list[Path]:
    """The transcript files :meth:`EvalReport.write` gives these results."""
    keys = (transcript_key(r["configuration"], r["stage"], r["decoding"]) for r in results)
    return [eval_dir / "transcripts" / f"{safe_filename(key)}.jsonl" for key in keys]


def cached_entry(
    configuration: EvalConfiguration, settings: EvalSettings, eval_dir: Path
) -> dict[str, Any] | None:
    """The evaluation recorded for ``configuration`` in ``eval_dir`` (``results``: its :class:`EvalResult` list;
    ``reflection_memos``: the memo counts of its own evaluation, empty when it was evaluated together with others) if
    its key still matches and its transcripts are there, else ``None``."""
    key = cache_key(configuration, settings)
    path = Path(eval_dir) / CACHE_DIR / f"{safe_filename(configuration.name)}.json"
    if key is None or not path.is_file():
        return None
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    results = entry.get("results") or []
    if (
        entry.get("key") != key
        or not results
        or not all(p.is_file() for p in transcript_files(Path(eval_dir), results))
    ):
        return None
    return {
        "results": [EvalResult(**r) for r in results],
        "reflection_memos": entry.get("reflection_memos") or {},
    }


def save_cache_entry(
    configuration: EvalConfiguration,
    settings: EvalSettings,
    results: Sequence[EvalResult],
    eval_dir: Path,
    reflection_memos: dict[str, dict[str, int]] | None = None,
) -> None:
    """Record ``configuration``'s ``results`` (their transcripts already in ``eval_dir``) for later reuse; nothing
    when one of its models has no job record."""
    key = cache_key(configuration, settings)
    if key is None:
        return
    entry = {"key": key, "results": [asdict(r) for r in results], "reflection_memos": reflection_memos or {}}
    (Path(eval_dir) / CACHE_DIR).mkdir(parents=True, exist_ok=True)
    (Path(eval_dir) / CACHE_DIR / f"{safe_filename(configuration.name)}.json").write_text(
        json.dumps(entry) + "\n"
    )


def merge_memos(*memos: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The reflection memo counts of several evaluations, added up per reflection model."""
    total: dict[str, dict[str, int]] = {}
    for counts in memos:
        for model, values in counts.items():
            into = total.setdefault(model, {})
            for name, value in values.items():
                into[name] = into.get(name, 0) + value
    return total


def configuration_job(
    configuration: EvalConfiguration,
    settings: EvalSettings,
    eval_dir: str | Path,
    needs: tuple[str, ...] = (),
) -> Job:
    """A ``reflect-trl eval`` job (named after the configuration) of ``configuration`` alone, in one thread, into
    ``<eval_dir>/workers/<configuration>/`` (its log beside it). When it succeeds, its ``after`` moves its transcripts
    into ``<eval_dir>/transcripts`` and records its results in the cache, where :func:`evaluate_reusing` finds them."""
    import shutil

    import yaml

    eval_dir = Path(eval_dir)
    stem = safe_filename(configuration.name)
    work = eval_dir / WORK_DIR
    part = work / stem
    shutil.rmtree(part, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    config = work / f"{stem}.yaml"
    config.write_text(
        yaml.safe_dump({**asdict(settings), "configurations": [asdict(configuration)]}, sort_keys=False)
    )

    def record() -> None:
        recorded = json.loads((part / "results.json").read_text())
        (eval_dir / "transcripts").mkdir(parents=True, exist_ok=True)
        for transcript in (part / "transcripts").glob("*.jsonl"):
            transcript.replace(eval_dir / "transcripts" / transcript.name)
        results = [EvalResult(**r) for r in recorded["results"]]
        save_cache_entry(configuration, settings, results, eval_dir, recorded.get("reflection_memos"))

    argv = ["--config", str(config), "--output_dir", str(part)]
    return Job(configuration.name, "eval", argv, needs, log=work / f"{stem}.log", after=record)


def evaluate_in_workers(
    configurations: Sequence[EvalConfiguration],
    settings: EvalSettings,
    eval_dir: Path,
    workers: int,
    say=print,
) -> EvalReport:
    """:func:`reflect_trl.evaluation.evaluate` of ``configurations``, one :func:`configuration_job` each, ``workers``
    at a time (those with a reflection model first: they take longest); their transcripts are moved into
    ``eval_dir/transcripts``, so the report carries none."""
    jobs = [
        configuration_job(c, settings, eval_dir)
        for c in sorted(configurations, key=lambda c: c.reflection is None)
    ]
    logs = {job.name: job.log for job in jobs}

    def report(name: str, event: str, seconds: float) -> None:
        if event == "start":
            say(f"[eval] {name} started (log {logs[name]})")
        elif event == "done":
            say(f"[eval] {name} done in {seconds:.0f}s")

    run_jobs(jobs, workers=min(workers, len(jobs)), report=report)
    results: dict[str, list[EvalResult]] = {}
    memos = []
    for c in configurations:
        recorded = json.loads(
            (Path(eval_dir) / WORK_DIR / safe_filename(c.name) / "results.json").read_text()
        )
        results[c.name] = [EvalResult(**r) for r in recorded["results"]]
        memos.append(recorded.get("reflection_memos") or {})
    ordered = [r for c in configurations for r in results[c.name]]
    return EvalReport(settings, list(configurations), ordered, reflection_memos=merge_memos(*memos))


def evaluate_reusing(
    configurations: Sequence[EvalConfiguration],
    settings: EvalSettings,
    eval_dir: str | Path,
    reuse: bool = True,
    workers: int = 1,
    say=print,
) -> tuple[EvalReport, dict[str, Path]]:
    """:func:`reflect_trl.evaluation.evaluate` of the configurations whose recorded results in ``eval_dir`` are out of
    date (all of them when ``reuse`` is false), the recorded results of the others; writes the report to ``eval_dir``
    and records the new results. ``workers`` > 1: :func:`evaluate_in_workers`. Returns the report (results in the
    order of ``configurations``; reflection memo counts of the evaluations the results come from, where recorded) and
    the paths :meth:`EvalReport.write` returns."""
    eval_dir = Path(eval_dir)
    reused = {c.name: cached_entry(c, settings, eval_dir) if reuse else None for c in configurations}
    fresh = [c for c in configurations if reused[c.name] is None]
    for c in configurations:
        if reused[c.name] is not None:
            say(
                f"[eval] {c.name}: reused (its runs and the evaluation settings are unchanged since it was evaluated)"
            )
    in_workers = workers > 1 and len(fresh) > 1
    if not fresh:
        report = EvalReport(settings, [], [])
    elif in_workers:  # each job records its own results
        report = evaluate_in_workers(fresh, settings, eval_dir, workers, say)
    else:
        report = evaluate(fresh, settings)
    new = {c.name: [r for r in report.results if r.configuration == c.name] for c in fresh}
    report_memos = report.reflection_memos
    report.configurations = list(configurations)
    report.results = [
        r for c in configurations for r in (reused[c.name]["results"] if reused[c.name] else new[c.name])
    ]
    report.reflection_memos = merge_memos(
        report.reflection_memos, *(e["reflection_memos"] for e in reused.values() if e)
    )
    paths = report.write(eval_dir)
    if not in_workers:  # the memo counts are one configuration's only when it was evaluated alone
        alone = report_memos if len(fresh) == 1 else None
        for c in fresh:
            save_cache_entry(c, settings, new[c.name], eval_dir, alone)
    return report, paths


__all__ = [
    "cache_key",
    "cached_entry",
    "configuration_job",
    "evaluate_in_workers",
    "evaluate_reusing",
    "job_record",
    "merge_memos",
    "save_cache_entry",
]
