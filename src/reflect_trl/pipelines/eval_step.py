"""The pipelines' evaluation step (``demo``, ``reproduce``): reuse of earlier evaluations, and evaluation split over
worker processes.

**Reuse.** A configuration whose runs and evaluation settings are unchanged since it was last evaluated in the same
folder is not evaluated again. Its cache entry (``<eval dir>/cache/<configuration>.json``) holds its results and a
key: the evaluation settings, the configuration, and the job record (:data:`reflect_trl.pipelines.jobs.DONE_MARKER`:
command line and version, plus the time it was written) of every run it reads. A job that runs again rewrites its
record, so the entry no longer matches; a model without a job record (a hub id, a folder trained by hand) is always
evaluated. The entry is written after the configuration's transcripts, and an entry whose transcripts are gone is
evaluated again.

**Workers.** With ``workers`` > 1 the configurations to evaluate are shared out to that many ``reflect-trl eval``
processes (one thread each, :func:`reflect_trl.pipelines.jobs.run_jobs`); every configuration's episodes are seeded
per stage and decoding, so the split does not change a result.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

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
    """What an evaluation of ``configuration`` depends on; ``None`` when one of its models has no job record."""
    records = {"policy": job_record(configuration.policy), "reflection": job_record(configuration.reflection)}
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


def cached_results(
    configuration: EvalConfiguration, settings: EvalSettings, eval_dir: Path
) -> list[EvalResult] | None:
    """The results recorded for ``configuration`` in ``eval_dir`` if its key still matches and its transcripts are
    there, else ``None``."""
    key = cache_key(configuration, settings)
    path = eval_dir / CACHE_DIR / f"{safe_filename(configuration.name)}.json"
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
        or not all(p.is_file() for p in transcript_files(eval_dir, results))
    ):
        return None
    return [EvalResult(**r) for r in results]


def save_cache_entries(
    report: EvalReport, eval_dir: Path, configurations: Sequence[EvalConfiguration]
) -> None:
    """Record ``configurations``' results of ``report`` (already written to ``eval_dir``) for later reuse."""
    (eval_dir / CACHE_DIR).mkdir(parents=True, exist_ok=True)
    for configuration in configurations:
        key = cache_key(configuration, report.settings)
        if key is None:
            continue
        results = [asdict(r) for r in report.results if r.configuration == configuration.name]
        entry = {"key": key, "results": results}
        path = eval_dir / CACHE_DIR / f"{safe_filename(configuration.name)}.json"
        path.write_text(json.dumps(entry) + "\n")


def share_out(configurations: Sequence[EvalConfiguration], workers: int) -> list[list[EvalConfiguration]]:
    """At most ``workers`` non-empty groups of about equal cost (a configuration with a reflection model counts twice:
    it generates reflections), each in the given order."""
    groups: list[list[EvalConfiguration]] = [[] for _ in range(max(1, min(workers, len(configurations))))]
    load = [0] * len(groups)
    for c in sorted(configurations, key=lambda c: c.reflection is None):  # the costly ones first
        lightest = load.index(min(load))
        groups[lightest].append(c)
        load[lightest] += 1 if c.reflection is None else 2
    order = {c.name: i for i, c in enumerate(configurations)}
    return [sorted(g, key=lambda c: order[c.name]) for g in groups]


def evaluate_in_workers(
    configurations: Sequence[EvalConfiguration],
    settings: EvalSettings,
    eval_dir: Path,
    workers: int,
    say=print,
) -> EvalReport:
    """:func:`reflect_trl.evaluation.evaluate` of ``configurations`` in ``workers`` ``reflect-trl eval`` processes;
    their transcripts are moved into ``eval_dir/transcripts``, so the report carries none."""
    import shutil

    import yaml

    work = eval_dir / WORK_DIR
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    jobs, parts, names = [], [], {}
    for i, group in enumerate(share_out(configurations, workers)):
        config = work / f"worker_{i}.yaml"
        config.write_text(
            yaml.safe_dump(
                {**asdict(settings), "configurations": [asdict(c) for c in group]}, sort_keys=False
            )
        )
        parts.append(work / f"worker_{i}")
        argv = ["--config", str(config), "--output_dir", str(parts[-1])]
        jobs.append(Job(f"evaluation {i}", "eval", argv, log=work / f"worker_{i}.log"))
        names[jobs[-1].name] = ", ".join(c.name for c in group)

    def report(name: str, event: str, seconds: float) -> None:
        if event == "start":
            say(f"[eval] {name} (log {work / name.replace('evaluation ', 'worker_')}.log): {names[name]}")
        elif event == "done":
            say(f"[eval] {name} done in {seconds:.0f}s")

    run_jobs(jobs, workers=len(jobs), report=report)
    results: dict[str, list[EvalResult]] = {}
    memos: dict[str, dict[str, int]] = {}
    (eval_dir / "transcripts").mkdir(parents=True, exist_ok=True)
    for part in parts:
        recorded = json.loads((part / "results.json").read_text())
        for r in recorded["results"]:
            results.setdefault(r["configuration"], []).append(EvalResult(**r))
        memos.update(recorded.get("reflection_memos") or {})
        for transcript in (part / "transcripts").glob("*.jsonl"):
            transcript.replace(eval_dir / "transcripts" / transcript.name)
    ordered = [r for c in configurations for r in results[c.name]]
    return EvalReport(settings, list(configurations), ordered, reflection_memos=memos)


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
    order of ``configurations``) and the paths :meth:`EvalReport.write` returns."""
    eval_dir = Path(eval_dir)
    reused = {c.name: cached_results(c, settings, eval_dir) if reuse else None for c in configurations}
    fresh = [c for c in configurations if reused[c.name] is None]
    for c in configurations:
        if reused[c.name] is not None:
            say(
                f"[eval] {c.name}: reused (its runs and the evaluation settings are unchanged since it was evaluated)"
            )
    if not fresh:
        report = EvalReport(settings, [], [])
    elif workers > 1 and len(fresh) > 1:
        report = evaluate_in_workers(fresh, settings, eval_dir, workers, say)
    else:
        report = evaluate(fresh, settings)
    new = {c.name: [r for r in report.results if r.configuration == c.name] for c in fresh}
    report.configurations = list(configurations)
    report.results = [r for c in configurations for r in (reused[c.name] or new[c.name])]
    paths = report.write(eval_dir)
    save_cache_entries(report, eval_dir, fresh)
    return report, paths


__all__ = [
    "cache_key",
    "cached_results",
    "evaluate_in_workers",
    "evaluate_reusing",
    "job_record",
    "save_cache_entries",
    "share_out",
]
