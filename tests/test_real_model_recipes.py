"""The real-model recipes of DangerousTaxi (recipes/taxi/*.yaml) keep the validated CPU recipe's values
(recipes/taxi/cpu/*.yaml) except an explicit allow-list, and every allowed difference carries a comment saying why."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
#: Keys that name this run's paths (they point to outputs/taxi/ instead of outputs/taxi/cpu/, or to the model).
PATHS = {"model_name_or_path", "reflection_model_name_or_path", "output_dir", "configurations"}
#: Values that may differ from the CPU recipe's; the real recipe's line must say why in a comment.
ALLOWED = {"bf16", "learning_rate"}
#: CPU-only keys the real recipes leave out.
CPU_ONLY = {"use_cpu"}
#: Keys only the real recipes have: the dtype of a GPU run and the LoRA settings.
REAL_ONLY = {
    "dtype",
    "reflection_dtype",
    "use_peft",
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
}
NAMES = ["data.yaml", "eval.yaml", "rl.yaml", "sft_policy.yaml", "sft_reflection.yaml", "sft_plain.yaml"]


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("name", NAMES)
def test_real_recipe_matches_the_cpu_recipe(name):
    real_path, cpu_path = RECIPES / "taxi" / name, RECIPES / "taxi" / "cpu" / name
    real, cpu = _load(real_path), _load(cpu_path)
    text = real_path.read_text()
    assert set(cpu) - CPU_ONLY <= set(real), f"{name}: missing {sorted(set(cpu) - CPU_ONLY - set(real))}"
    assert set(real) - set(cpu) <= REAL_ONLY, (
        f"{name}: unexpected keys {sorted(set(real) - set(cpu) - REAL_ONLY)}"
    )
    differ = {k for k in set(cpu) & set(real) - PATHS if real[k] != cpu[k]}
    assert differ <= ALLOWED, {k: (cpu[k], real[k]) for k in differ - ALLOWED}
    for key in differ:  # the line of an allowed difference explains it
        assert re.search(rf"^{key}:[^#\n]*#\s*differs: \S", text, re.M), (
            f"{name}: {key} differs without a comment"
        )
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    assert "SmolLM2-135M-Instruct" in header and "NOT YET RUN ON A GPU" in header
    if real.get("use_peft"):
        assert real["lora_target_modules"] == "all-linear"


def test_rl_recipe_keeps_the_validated_protocol():
    """What the issue listed as contradicting the CPU experiments is gone from the real RL recipe."""
    real = _load(RECIPES / "taxi" / "rl.yaml")
    assert real["advantage_estimator"] == "gigpo" and real["gamma"] == 1.0 and real["beta"] == 0.05
    assert real["reflection_temperature"] == 0.0 and real["replay_buffer_size"] == 0
    assert real["env_kwargs"] == {"step_reward": 0}
    assert "whiten_advantages" not in real and "c_attn" not in (RECIPES / "taxi" / "rl.yaml").read_text()


def test_no_recipe_names_gpt2_only_lora_targets():
    for path in sorted(RECIPES.rglob("*.yaml")):
        targets = (_load(path) or {}).get("lora_target_modules")
        assert targets in (None, "all-linear"), (path, targets)
