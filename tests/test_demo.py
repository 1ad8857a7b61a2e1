"""The demo pipeline in miniature: every step runs and every output file is written."""

from __future__ import annotations

import json

from reflect_trl.demo import RL_RUNS, SFT_RUNS, TABLE_ROWS, DemoConfig, run_demo


def test_smoke_demo_produces_every_output(tmp_path):
    out = tmp_path / "demo"
    summary = run_demo(DemoConfig.smoke(str(out)))
    for name in (*SFT_RUNS, *RL_RUNS):
        assert (out / "runs" / name / "config.json").is_file(), name
    for name in RL_RUNS:
        history = json.loads((out / "runs" / name / "log_history.json").read_text())
        assert any("env/success_rate" in h for h in history)
    for path in ("eval/results.md", "eval/results.json", "learning_curves.png", "success_bars_greedy.png",
                 "summary.json", "results.md", "demo_config.json"):
        assert (out / path).is_file() and (out / path).stat().st_size > 0, path
    table = (out / "eval" / "results.md").read_text()
    for label, _, _ in TABLE_ROWS:
        assert f"| {label} |" in table
    results = json.loads((out / "eval" / "results.json").read_text())["results"]
    assert len(results) == len(TABLE_ROWS) * 3  # three DangerousTaxi stages, greedy decoding
    assert len(list((out / "eval" / "transcripts").glob("*.jsonl"))) == len(results)
    assert set(summary["timings_seconds"]) and summary["total_seconds"] > 0
