"""benchmarks/rl_steps.py: the shorter RL run is the seed's own ``rl_reflect`` job, changed only in steps, output
folder and tracking."""

from __future__ import annotations

from _benchmarks import demo_seed_dir, load_benchmark
from reflect_trl.demo import demo_jobs


def test_the_shorter_run_is_the_seeds_rl_reflect_job(tmp_path):
    bench = load_benchmark("rl_steps")
    seed_dir, cfg = demo_seed_dir(tmp_path, 2)
    job = bench.rl_reflect_job(seed_dir, 150, tmp_path / "rl150_seed2")
    assert (job.name, job.command) == ("rl150_seed2", "rl")
    original = next(
        j
        for j in demo_jobs(cfg, seed_dir / "models", seed_dir / "data" / cfg.env_name, seed_dir / "runs")
        if j.name == "rl_reflect"
    )
    flags = dict(zip(job.argv[::2], job.argv[1::2], strict=True))
    want = dict(zip(original.argv[::2], original.argv[1::2], strict=True))
    assert {k for k in want if flags[k] != want[k]} == {"--max_steps", "--output_dir", "--report_to"}
    assert flags["--max_steps"] == "150" and flags["--output_dir"] == str(tmp_path / "rl150_seed2")
    assert set(flags) - set(want) == {"--reflection_cache_size"}  # the default size, spelled out


def test_a_variant_appends_its_rl_flags(tmp_path):
    bench = load_benchmark("rl_steps")
    seed_dir, _ = demo_seed_dir(tmp_path, 2)
    job = bench.rl_reflect_job(seed_dir, 300, tmp_path / "unscaled_seed2", ["--scale_rewards", "none"])
    assert job.argv[-2:] == ["--scale_rewards", "none"]
    assert job.argv[job.argv.index("--max_steps") + 1] == "300"


def test_seed_dir_in_a_flag_is_the_seeds_folder(tmp_path):
    bench = load_benchmark("rl_steps")
    seed_dir, _ = demo_seed_dir(tmp_path, 2)
    extra = ["--sft_anchor_data", "{seed_dir}/data/taxi/policy_reflect_model"]
    job = bench.rl_reflect_job(seed_dir, 300, tmp_path / "anchor_seed2", extra)
    assert job.argv[-2:] == ["--sft_anchor_data", f"{seed_dir}/data/taxi/policy_reflect_model"]
