"""benchmarks/reflection_memo.py: the RL half reruns the seed's own ``rl_reflect`` command, changed only in steps,
output folder, tracking and memo size."""

from __future__ import annotations

import pytest

from _benchmarks import demo_seed_dir, load_benchmark
from reflect_trl.demo import demo_jobs


def test_rl_argv_is_the_seeds_rl_reflect_command(tmp_path):
    memo = load_benchmark("reflection_memo")
    seed_dir, cfg = demo_seed_dir(tmp_path, 1)
    argv = memo.rl_argv(seed_dir, 7, tmp_path / "out", 0)
    assert argv[1:4] == ["-m", "reflect_trl.cli", "rl"] and argv[-2:] == ["--reflection_cache_size", "0"]
    flags = dict(zip(argv[4:-2:2], argv[5:-2:2], strict=True))
    original = next(
        j
        for j in demo_jobs(cfg, seed_dir / "models", seed_dir / "data" / cfg.env_name, seed_dir / "runs")
        if j.name == "rl_reflect"
    )
    want = dict(zip(original.argv[::2], original.argv[1::2], strict=True))
    changed = {k for k in want if flags[k] != want[k]}
    assert changed == {"--max_steps", "--output_dir", "--report_to"}
    assert flags["--max_steps"] == "7" and flags["--report_to"] == "none"
    assert flags["--reflection_temperature"] == "0", "the demo's RL reflects greedily: the memo is in play"
    with pytest.raises(SystemExit, match="demo_config.json is missing"):
        memo.rl_argv(tmp_path, 7, tmp_path / "out", 0)
