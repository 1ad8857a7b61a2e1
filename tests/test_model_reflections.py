"""``reflect-trl relabel``: the policy data with the SFT'd reflection model's own reflections."""

from __future__ import annotations

import json

from reflect_trl.data.builder import DataBuilderConfig, build_datasets
from reflect_trl.data.relabel import relabel_dataset, split_policy_prompt


def test_relabel_writes_the_dataset_and_a_jsonl_next_to_it(tiny_model_dir, tmp_path):
    """Targets unchanged, every row carries a model reflection, and an output name with a dot (a temperature) keeps
    it: ``data_T0.7`` -> ``data_T0.7.jsonl``, not ``data_T0.jsonl``."""
    from datasets import load_from_disk

    config = DataBuilderConfig(
        env_name="taxi", n_train_tasks=2, n_val_tasks=1, output_dir=str(tmp_path / "data")
    )
    build_datasets(config)
    source = tmp_path / "data" / "taxi" / "policy_reflect.jsonl"
    output = tmp_path / "data" / "taxi" / "relabelled_T0.7"
    stats = relabel_dataset(
        source, tiny_model_dir, output, temperature=0.7, max_new_tokens=4, keep_oracle_rows=False
    )
    assert (tmp_path / "data" / "taxi" / "relabelled_T0.7.jsonl").is_file()
    assert not (tmp_path / "data" / "taxi" / "relabelled_T0.jsonl").exists()
    saved = load_from_disk(str(output))
    lines = [
        json.loads(x) for x in (tmp_path / "data" / "taxi" / "relabelled_T0.7.jsonl").read_text().splitlines()
    ]
    assert len(lines) == sum(len(saved[s]) for s in saved) == sum(v["rows"] for v in stats.values())
    original = [json.loads(x) for x in source.read_text().splitlines()]
    for new, old in zip(
        saved["train"], [r for r in original if r.get("split", "train") == "train"], strict=True
    ):
        assert new["completion"] == old["completion"] and new["reflection_source"] == "model"
        assert split_policy_prompt(new["prompt"])[0] == split_policy_prompt(old["prompt"])[0]
