"""LoRA targets for any architecture: all-linear by default, a clear error when the targets match nothing."""

from __future__ import annotations

import pytest
from peft import get_peft_model
from trl import ModelConfig

from reflect_trl.errors import UsageError
from reflect_trl.lora import (
    ALL_LINEAR,
    check_lora_targets,
    linear_module_names,
    lora_config,
    matched_modules,
    meta_model,
)
from reflect_trl.models import load_causal_lm


def _args(targets=None) -> ModelConfig:
    return ModelConfig(use_peft=True, lora_r=4, lora_alpha=8, lora_target_modules=targets)


def test_linear_names_per_architecture(tiny_model_dir, tiny_llama_dir):
    gpt2, llama = meta_model(tiny_model_dir), meta_model(tiny_llama_dir)
    assert linear_module_names(gpt2) == ["c_attn", "c_fc", "c_proj"]  # Conv1D layers; lm_head left out
    assert linear_module_names(llama) == [
        "down_proj",
        "gate_proj",
        "k_proj",
        "o_proj",
        "q_proj",
        "up_proj",
        "v_proj",
    ]
    layers = llama.config.num_hidden_layers
    assert len(matched_modules(llama, ALL_LINEAR)) == 7 * layers
    assert len(matched_modules(llama, ["q_proj", "v_proj"])) == 2 * layers
    assert matched_modules(llama, r".*\.0\.self_attn\.q_proj") == ["model.layers.0.self_attn.q_proj"]


@pytest.mark.parametrize("fixture", ["tiny_model_dir", "tiny_llama_dir"])
def test_default_all_linear_adapts_every_linear_layer(request, fixture):
    path = request.getfixturevalue(fixture)
    args = _args()
    config = lora_config(args, path)
    assert args.lora_target_modules == ALL_LINEAR and config.target_modules == ALL_LINEAR
    model = get_peft_model(load_causal_lm(path), config)
    base = model.get_base_model()
    wrapped = sorted({n.rsplit(".", 2)[-2] for n, _ in base.named_modules() if n.endswith(".lora_A")})
    assert wrapped == linear_module_names(meta_model(path))
    assert all("lm_head" not in n for n, _ in base.named_modules() if n.endswith(".lora_A"))


def test_targets_that_match_nothing_are_an_error_naming_the_layers(tiny_model_dir, tiny_llama_dir):
    with pytest.raises(UsageError) as err:
        lora_config(_args(["c_attn", "c_proj"]), tiny_llama_dir)
    message = str(err.value)
    assert "'llama'" in message and "q_proj" in message and "down_proj" in message and "all-linear" in message
    with pytest.raises(UsageError, match="'gpt2'"):
        check_lora_targets(meta_model(tiny_model_dir), ["q_proj", "v_proj"])  # Llama names on a GPT-2


def test_explicit_targets_are_kept_and_no_peft_is_none(tiny_llama_dir):
    config = lora_config(_args(["q_proj", "v_proj"]), tiny_llama_dir)
    assert set(config.target_modules) == {"q_proj", "v_proj"}
    assert lora_config(ModelConfig(use_peft=False), tiny_llama_dir) is None
    assert lora_config(_args([ALL_LINEAR])).target_modules == ALL_LINEAR  # `--lora_target_modules all-linear`


def test_sft_command_refuses_targets_that_match_nothing(tiny_llama_dir, tmp_path, capsys):
    """`reflect-trl sft` checks the targets against the model before training: one line naming the layers, exit 2,
    no output folder left behind."""
    from reflect_trl.cli import main
    from reflect_trl.data.builder import DataBuilderConfig, build_datasets

    build_datasets(
        DataBuilderConfig(env_name="taxi", n_train_tasks=2, n_val_tasks=1, output_dir=str(tmp_path))
    )
    out = tmp_path / "sft"
    argv = [
        "sft",
        "--model_name_or_path",
        tiny_llama_dir,
        "--dataset_path",
        str(tmp_path / "taxi" / "reflection"),
    ]
    argv += [
        "--role",
        "reflection",
        "--output_dir",
        str(out),
        "--use_peft",
        "true",
        "--lora_target_modules",
        "c_attn",
    ]
    argv += ["--max_steps", "1", "--use_cpu", "true", "--bf16", "false", "--report_to", "none"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "lora_target_modules 'c_attn' match no layer of this 'llama' model" in err and "q_proj" in err
    assert not out.exists()
