"""Every recipe under recipes/ parses with its config class; an unknown key is an error.

The files are globbed, so a new recipe is covered as soon as it exists, and a YAML file of a kind this test does
not know fails ``test_every_recipe_is_of_a_known_kind``. Parsing writes nothing: ``output_dir`` points to tmp_path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
ALL_YAML = sorted(p.relative_to(RECIPES).as_posix() for p in RECIPES.rglob("*.yaml"))
KINDS = {
    "data": "**/data.yaml",
    "sft": "**/sft_*.yaml",
    "rl": "**/rl.yaml",
    "eval": "**/eval*.yaml",
    "accelerate": "accelerate_configs/*.yaml",
}
# Training recipes for GPUs say bf16: true; parse them as on a CPU machine.
CPU = ["--use_cpu", "--bf16", "false"]


def recipes(kind: str) -> list[str]:
    return sorted(p.relative_to(RECIPES).as_posix() for p in RECIPES.glob(KINDS[kind]))


def test_every_recipe_is_of_a_known_kind():
    covered = {name for kind in KINDS for name in recipes(kind)}
    assert ALL_YAML and set(ALL_YAML) == covered, sorted(set(ALL_YAML) - covered)
    assert all(recipes(kind) for kind in KINDS)


def parse_data(path: Path, output_dir: Path):
    from trl import TrlParser

    from reflect_trl.data.builder import DataBuilderConfig

    (config,) = TrlParser((DataBuilderConfig,)).parse_args_and_config(
        ["--config", str(path), "--output_dir", str(output_dir)]
    )
    return config


def parse_sft(path: Path, output_dir: Path):
    from reflect_trl.cli.sft import sft_parser

    return sft_parser().parse_args_and_config(["--config", str(path), "--output_dir", str(output_dir), *CPU])


def parse_rl(path: Path, output_dir: Path):
    from trl import ModelConfig, TrlParser

    from reflect_trl.trainers.rl_config import ReflectPPOConfig

    return TrlParser((ReflectPPOConfig, ModelConfig)).parse_args_and_config(
        ["--config", str(path), "--output_dir", str(output_dir), *CPU]
    )


def parse_eval(path: Path, output_dir: Path):
    from reflect_trl.cli.eval import parse_eval_args

    return parse_eval_args(["--config", str(path), "--output_dir", str(output_dir)])


def parse_accelerate(path: Path, output_dir: Path):
    from accelerate.commands.config.config_args import load_config_from_file

    return load_config_from_file(str(path))


PARSERS = {
    "data": parse_data,
    "sft": parse_sft,
    "rl": parse_rl,
    "eval": parse_eval,
    "accelerate": parse_accelerate,
}


@pytest.mark.parametrize("recipe", recipes("data"))
def test_data_recipe(recipe, tmp_path):
    from reflect_trl.envs import get_env_class

    config = parse_data(RECIPES / recipe, tmp_path)
    assert config.output_dir == str(tmp_path)
    stages = get_env_class(config.env_name).stages
    assert set(config.stages or stages) <= set(stages)
    assert config.n_train_tasks > 0 and config.n_val_tasks > 0


@pytest.mark.parametrize("recipe", recipes("sft"))
def test_sft_recipe(recipe, tmp_path):
    script_args, training_args, model_args = parse_sft(RECIPES / recipe, tmp_path)
    assert training_args.output_dir == str(tmp_path)
    assert script_args.dataset_path and model_args.model_name_or_path
    expected_role = "reflection" if recipe.endswith("sft_reflection.yaml") else "policy"
    assert training_args.role == expected_role
    assert script_args.dataset_path.endswith(
        "reflection" if expected_role == "reflection" else ("plain", "reflect", "reflect_model", "lookup")
    )


@pytest.mark.parametrize("recipe", recipes("rl"))
def test_rl_recipe(recipe, tmp_path):
    from reflect_trl.envs import get_env_class

    training_args, model_args = parse_rl(RECIPES / recipe, tmp_path)
    assert training_args.output_dir == str(tmp_path)
    assert model_args.model_name_or_path
    get_env_class(training_args.env_name)  # a registered environment
    assert training_args.advantage_estimator in ("reinforce", "rloo", "gae", "gigpo")


@pytest.mark.parametrize("recipe", recipes("eval"))
def test_eval_recipe(recipe, tmp_path):
    from reflect_trl.envs import get_env_class

    configurations, settings, output_dir = parse_eval(RECIPES / recipe, tmp_path)
    assert output_dir == str(tmp_path) and configurations
    stages = get_env_class(settings.env_name).stages
    assert set(settings.stages or stages) <= set(stages)
    assert len({c.name for c in configurations}) == len(configurations)


@pytest.mark.parametrize("recipe", recipes("accelerate"))
def test_accelerate_config(recipe):
    from accelerate.utils import DistributedType

    config = parse_accelerate(RECIPES / recipe, None)
    raw = yaml.safe_load((RECIPES / recipe).read_text())
    assert {
        "compute_environment",
        "distributed_type",
        "num_machines",
        "num_processes",
        "mixed_precision",
    } <= set(raw)
    assert config.distributed_type in set(DistributedType)
    assert config.num_machines >= 1 and config.num_processes >= 1
    assert config.mixed_precision in ("no", "fp16", "bf16")
    if config.distributed_type == DistributedType.DEEPSPEED:
        assert config.deepspeed_config["zero_stage"] in (0, 1, 2, 3)
    if config.distributed_type == DistributedType.FSDP:
        assert "fsdp_version" in config.fsdp_config


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_an_unknown_key_is_an_error(kind, tmp_path):
    source = RECIPES / recipes(kind)[0]
    bad = tmp_path / source.name
    bad.write_text(source.read_text() + "\nnot_a_setting_anywhere: 1\n")
    with pytest.raises((ValueError, SystemExit)):
        PARSERS[kind](bad, tmp_path / "out")


def test_one_advantage_estimator_everywhere():
    """The config's default estimator is the one every shipped RL recipe, the scaffold's recipes, the example plugin,
    the README's Python snippet and docs/design.md name."""
    import re

    from reflect_trl.trainers.rl_config import ReflectPPOConfig

    default = ReflectPPOConfig.__dataclass_fields__["advantage_estimator"].default
    repo = RECIPES.parent
    files = [RECIPES / name for name in recipes("rl")]
    files += sorted((repo / "src/reflect_trl/templates").rglob("rl.yaml.tmpl"))
    files += sorted((repo / "examples").rglob("rl.yaml"))
    named = {}
    for path in files:
        found = re.findall(r"^advantage_estimator:\s*(\w+)", path.read_text(), re.M)
        named[path.relative_to(repo).as_posix()] = found[0] if found else default
    assert set(named.values()) == {default}, named
    assert re.findall(r'advantage_estimator="(\w+)"', (repo / "README.md").read_text()) == [default]
    assert f"`{default}` (the default)" in (repo / "docs/design.md").read_text()
