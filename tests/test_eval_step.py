"""A pipeline's evaluations are reused only while the runs and the settings they measured are unchanged."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from reflect_trl.evaluation import EvalConfiguration, EvalSettings
from reflect_trl.pipelines import eval_step
from reflect_trl.pipelines.jobs import DONE_MARKER

SETTINGS = EvalSettings(
    env_name="taxi", episodes_per_stage=3, stages=["pickup"], seed=1, reflection_max_new_tokens=4
)


def _run(root: Path, name: str, model: str, argv: list[str] | None = None) -> str:
    """A run folder as a pipeline job leaves it: the model and the job record."""
    folder = root / name
    shutil.copytree(model, folder)
    record = {"command": "rl", "argv": argv or ["--output_dir", str(folder)], "reflect_trl": "0"}
    (folder / DONE_MARKER).write_text(json.dumps(record) + "\n")
    return str(folder)


@pytest.fixture
def evaluated(monkeypatch):
    """The configurations :func:`eval_step.evaluate_reusing` hands to the evaluation, call by call."""
    calls: list[list[str]] = []
    real = eval_step.evaluate

    def counting(configurations, settings, progress=True):
        calls.append([c.name for c in configurations])
        return real(configurations, settings, progress=False)

    monkeypatch.setattr(eval_step, "evaluate", counting)
    return calls


def _outcomes(report) -> list[dict]:
    return [{k: v for k, v in asdict(r).items() if k != "seconds"} for r in report.results]


def test_an_unchanged_configuration_is_not_evaluated_again(tiny_model_dir, tmp_path, evaluated):
    runs, eval_dir = tmp_path / "runs", tmp_path / "eval"
    policy = _run(runs, "rl_reflect", tiny_model_dir)
    reflection = _run(runs, "sft_reflection", tiny_model_dir)
    plain = EvalConfiguration("plain", policy)
    reflect = EvalConfiguration("reflect", policy, reflection=reflection)

    first, paths = eval_step.evaluate_reusing([plain], SETTINGS, eval_dir, say=lambda m: None)
    assert evaluated == [["plain"]] and len(first.results) == 2  # greedy and sampled
    assert json.loads(paths["json"].read_text())["results"] == [asdict(r) for r in first.results]

    # a configuration added to a finished evaluation: only it is evaluated; the table has both, in order
    messages: list[str] = []
    both, _ = eval_step.evaluate_reusing([plain, reflect], SETTINGS, eval_dir, say=messages.append)
    assert evaluated[-1] == ["reflect"]
    assert [r.configuration for r in both.results] == ["plain", "plain", "reflect", "reflect"]
    assert both.results[:2] == first.results  # reused as recorded, wall times included
    assert any("plain: reused" in m for m in messages)
    table = (eval_dir / "results.md").read_text()
    assert table.count("| plain |") == 2 and table.count("| reflect |") == 2
    assert len(list((eval_dir / "transcripts").glob("*.jsonl"))) == 4

    # nothing changed: nothing is evaluated, the results are the recorded ones
    again, _ = eval_step.evaluate_reusing([plain, reflect], SETTINGS, eval_dir, say=lambda m: None)
    assert len(evaluated) == 2 and again.results == both.results
    assert again.reflection_memos == both.reflection_memos != {}  # recorded with the one evaluated alone

    # the reused results are those a fresh evaluation gives
    fresh, _ = eval_step.evaluate_reusing([plain, reflect], SETTINGS, tmp_path / "fresh", say=lambda m: None)
    assert _outcomes(fresh) == _outcomes(again)


def test_a_rerun_job_other_settings_or_lost_transcripts_mean_evaluating_again(
    tiny_model_dir, tmp_path, evaluated
):
    runs, eval_dir = tmp_path / "runs", tmp_path / "eval"
    policy = _run(runs, "rl_both", tiny_model_dir)
    shutil.copytree(tiny_model_dir, Path(policy) / "reflection")  # a learned reflection inside the RL run
    reflect = EvalConfiguration("both", policy, reflection=str(Path(policy) / "reflection"))
    assert eval_step.cache_key(reflect, SETTINGS)["runs"]["reflection"]["job"]["command"] == "rl"

    def evaluate(configuration=reflect, settings=SETTINGS, **kwargs):
        eval_step.evaluate_reusing([configuration], settings, eval_dir, say=lambda m: None, **kwargs)
        return len(evaluated)

    assert evaluate() == 1 and evaluate() == 1
    # the job ran again: it rewrote its record (same command line, a later time)
    marker = Path(policy) / DONE_MARKER
    marker.write_text(marker.read_text())
    later = marker.stat().st_mtime_ns + 2_000_000_000  # minutes later in practice; 2 s for coarse file clocks
    os.utime(marker, ns=(later, later))
    assert evaluate() == 2 and evaluate() == 2
    # other evaluation settings
    assert evaluate(settings=replace(SETTINGS, episodes_per_stage=4)) == 3
    assert evaluate(settings=replace(SETTINGS, episodes_per_stage=4)) == 3
    # another model path under the same name
    other = _run(runs, "rl_other", tiny_model_dir)
    assert evaluate(configuration=replace(reflect, policy=other)) == 4
    # a transcript of the entry is gone
    next((eval_dir / "transcripts").glob("*.jsonl")).unlink()
    assert evaluate(configuration=replace(reflect, policy=other)) == 5
    # asked not to reuse (`demo --rerun`)
    assert evaluate(configuration=replace(reflect, policy=other), reuse=False) == 6


def test_a_model_no_job_wrote_is_always_evaluated(tiny_model_dir, tmp_path, evaluated):
    hand_made = EvalConfiguration("hand-made", tiny_model_dir)  # no job record: nothing says it is unchanged
    assert eval_step.cache_key(hand_made, SETTINGS) is None
    for _ in range(2):
        eval_step.evaluate_reusing([hand_made], SETTINGS, tmp_path / "eval", say=lambda m: None)
    assert evaluated == [["hand-made"], ["hand-made"]]
    assert not list((tmp_path / "eval" / eval_step.CACHE_DIR).glob("*.json"))


def test_a_scripted_policy_is_evaluated_once(tiny_model_dir, tmp_path, evaluated):
    """A scripted policy depends on no run: an unchanged one is reused, another one or other settings are not."""
    behaviour = EvalConfiguration("behaviour", "oracle_random")
    first, _ = eval_step.evaluate_reusing([behaviour], SETTINGS, tmp_path / "eval", say=lambda m: None)
    again, _ = eval_step.evaluate_reusing([behaviour], SETTINGS, tmp_path / "eval", say=lambda m: None)
    assert evaluated == [["behaviour"]] and again.results == first.results
    eval_step.evaluate_reusing(
        [replace(behaviour, policy="random")], SETTINGS, tmp_path / "eval", say=lambda m: None
    )
    eval_step.evaluate_reusing(
        [behaviour], replace(SETTINGS, episodes_per_stage=4), tmp_path / "eval", say=lambda m: None
    )
    assert evaluated == [["behaviour"]] * 3
    eval_step.evaluate_reusing(  # another probability of "oracle + random p" is another policy
        [replace(behaviour, policy="oracle_random:0.5")], SETTINGS, tmp_path / "eval", say=lambda m: None
    )
    assert evaluated == [["behaviour"]] * 4
    # with a trained reflection player, the run's record counts as for any policy
    reflection = _run(tmp_path / "runs", "sft_reflection", tiny_model_dir)
    key = eval_step.cache_key(replace(behaviour, policy="oracle", reflection=reflection), SETTINGS)
    assert (
        key["runs"]["policy"]["scripted"] == "oracle" and key["runs"]["reflection"]["job"]["command"] == "rl"
    )


def test_workers_evaluate_one_configuration_each_and_change_no_result(tiny_model_dir, tmp_path):
    runs = tmp_path / "runs"
    policy = _run(runs, "rl_reflect", tiny_model_dir)
    reflection = _run(runs, "sft_reflection", tiny_model_dir)
    configurations = [
        EvalConfiguration("plain", policy),
        EvalConfiguration("reflect", policy, reflection=reflection),
        EvalConfiguration("oracle", "oracle"),
    ]

    messages: list[str] = []
    split, paths = eval_step.evaluate_reusing(
        configurations, SETTINGS, tmp_path / "split", workers=2, say=messages.append
    )
    alone, _ = eval_step.evaluate_reusing(configurations, SETTINGS, tmp_path / "alone", say=lambda m: None)
    assert [r.configuration for r in split.results] == ["plain"] * 2 + ["reflect"] * 2 + ["oracle"]
    assert _outcomes(split) == _outcomes(alone)
    started = [m for m in messages if " started (log " in m]
    assert len(started) == 3 and started[0].startswith(
        "[eval] reflect started"
    )  # reflection models take longest
    assert f"(log {tmp_path / 'split' / 'workers' / 'reflect.log'})" in started[0]
    assert (
        split.reflection_memos == alone.reflection_memos and split.reflection_memos[reflection]["lookups"] > 0
    )
    assert json.loads(paths["json"].read_text())["results"] == [asdict(r) for r in split.results]
    for folder in ("split", "alone"):  # the same transcripts, in the same place
        names = sorted(p.name for p in (tmp_path / folder / "transcripts").glob("*.jsonl"))
        assert len(names) == 5
    for name in names:
        assert (tmp_path / "split" / "transcripts" / name).read_text() == (
            tmp_path / "alone" / "transcripts" / name
        ).read_text()
    # the split's results are recorded for reuse like any others, the scripted oracle's too
    assert sorted(p.stem for p in (tmp_path / "split" / eval_step.CACHE_DIR).glob("*.json")) == [
        "oracle",
        "plain",
        "reflect",
    ]


def test_a_configuration_job_records_its_evaluation_where_the_step_finds_it(
    tiny_model_dir, tmp_path, evaluated
):
    """A pipeline puts the job in its training graph; the evaluation step then only assembles the table."""
    from reflect_trl.evaluation import evaluate
    from reflect_trl.pipelines.jobs import Job, run_jobs

    runs, eval_dir = tmp_path / "runs", tmp_path / "eval"
    reflect = EvalConfiguration(
        "reflect", _run(runs, "rl_reflect", tiny_model_dir), _run(runs, "sft_reflection", tiny_model_dir)
    )
    trains = Job("train", "envs", [])  # stands for the job that trains the runs
    job = eval_step.configuration_job(reflect, SETTINGS, eval_dir, needs=("train",))
    assert job.name == "reflect" and job.command == "eval"
    events: list[tuple[str, str]] = []
    run_jobs([trains, job], report=lambda name, event, seconds: events.append((name, event)))
    assert events == [("train", "start"), ("train", "done"), ("reflect", "start"), ("reflect", "done")]
    assert len(list((eval_dir / "transcripts").glob("*.jsonl"))) == 2

    report, _ = eval_step.evaluate_reusing([reflect], SETTINGS, eval_dir, say=lambda m: None)
    assert evaluated == []  # found recorded
    direct = evaluate([reflect], SETTINGS, progress=False)
    assert _outcomes(report) == _outcomes(direct)
    assert report.reflection_memos == direct.reflection_memos != {}
