"""benchmarks/training_forwards.py on a seed folder of nano models: both settings run the trainers' own code and
agree; the report holds every timing."""

from __future__ import annotations

import shutil

from _benchmarks import load_benchmark
from reflect_trl.data.builder import DataBuilderConfig, build_datasets
from reflect_trl.tiny_models import build_tiny_model


def test_report_times_both_settings_and_they_agree(tmp_path):
    bench = load_benchmark("training_forwards")
    seed_dir = tmp_path / "seed_0"
    build_datasets(
        DataBuilderConfig(
            env_name="taxi", n_train_tasks=6, n_val_tasks=2, seed=0, output_dir=str(seed_dir / "data")
        )
    )
    base = build_tiny_model(seed_dir / "models" / "tiny-llama", arch="llama", preset="nano", seed=0)
    shutil.copytree(base, seed_dir / "runs" / "sft_policy")
    out = tmp_path / "bench" / "training_forwards.json"
    report = bench.main(
        ["--seed_dir", str(seed_dir), "--batch_size", "4", "--repeats", "1", "--output", str(out)]
    )
    assert out.is_file()
    for part in ("rl", "sft_policy", "sft_reflection"):
        assert set(report[part]["settings"]) == {"shared prefix", "plain"}
        for timings in report[part]["settings"].values():
            assert timings and all(v > 0 for v in timings.values())
    assert report["rl"]["max_logp_diff"] < 1e-4 and report["rl"]["max_grad_diff"] < 1e-4
    assert report["sft_policy"]["loss_diff"] < 1e-4 and report["sft_reflection"]["loss_diff"] < 1e-4
