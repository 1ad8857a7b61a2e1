"""benchmarks/real_model_steps.py on the nano Llama with LoRA: every part of the table is measured by
the trainers' own code, in a process of its own, and the report holds the raw timings."""

from __future__ import annotations

import json

from _benchmarks import load_benchmark
from reflect_trl.models import load_causal_lm


def test_report_splits_the_steps_and_records_memory(tiny_llama_dir, tmp_path):
    bench = load_benchmark("real_model_steps")
    out = tmp_path / "steps.json"
    results = bench.main(
        ["--model", f"lora={tiny_llama_dir}:lora"]
        + ["--sft_steps", "1", "--rl_batch_size", "4", "--reflection_tokens", "4", "--output", str(out)]
    )
    report = json.loads(out.read_text())
    assert [r["label"] for r in report["results"]] == ["lora"] == [r["label"] for r in results]
    for result in report["results"]:
        total = sum(p.numel() for p in load_causal_lm(tiny_llama_dir).parameters())
        assert result["lora"] and 0 < result["rl"]["trainable_parameters"] < total  # the adapters only
        assert result["architecture"] == "LlamaForCausalLM"
        for role in ("sft_policy", "sft_reflection"):
            assert len(result[role]["step_seconds"]) == 2 and result[role]["median_step_seconds"] > 0
        rl = result["rl"]
        assert len(rl["step_seconds"]) == 2  # one rollout, num_iterations 2
        for key in (
            "reflection_generate_s",
            "policy_forward_s",
            "scoring_old_ref_s",
            "loss_forward_s",
            "backward_s",
        ):
            assert rl[key] > 0, key
        assert 0 < rl["reflection_tokens"] <= 4 * rl["env_steps"]
        assert result["peak_rss_mib"] >= result["rss_after_sft_mib"] >= result["rss_after_data_mib"] > 0
    assert report["settings"]["threads"] == 1 and "loadavg_at_end" in report["machine"]
