"""The model cards (README.md) the trainers write: base model, environment, method and paper, how to act with the
model (the card's own Python snippet is executed), final metrics."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from reflect_trl.trainers.model_card import ModelCardFacts, render_model_card, rl_results, sft_results


def python_block(card: str) -> str:
    [code] = re.findall(r"```python\n(.*?)```", card, re.S)
    return code


def run_snippet(card: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(python_block(card), "README.md", "exec"), {})
    return out.getvalue()


def test_render_names_a_hub_base_model_in_the_metadata():
    facts = ModelCardFacts(
        model_name="rl",
        stage="rl",
        role="policy",
        model_dir="outputs/taxi/rl",
        base_model="openai-community/gpt2-xl",
        env_name="taxi",
        stages=("pickup", "full"),
        reflection_model=None,
        results={"stage/pickup/success_rate": 0.5, "env/return": -0.25},
    )
    card = render_model_card(facts)
    assert "base_model: openai-community/gpt2-xl" in card
    assert "[`openai-community/gpt2-xl`](https://huggingface.co/openai-community/gpt2-xl)" in card
    assert "none (the no-reflection baseline)" in card
    assert "| success rate, stage `pickup` | 50.0 % |" in card and "| `env/return` | -0.25 |" in card
    assert "reflect-trl eval --policy outputs/taxi/rl --env_name taxi" in card
    assert "https://arxiv.org/abs/2402.12621" in card and "@inproceedings{zhou2024reflectrl" in card
    assert "[None]" not in card and "`None`" not in card


def test_a_plugin_environment_is_named_with_its_distribution(tmp_path, monkeypatch):
    from _plugins import EXAMPLE_SRC, example_entry_points, write_distribution
    from reflect_trl.envs import entry_points
    from reflect_trl.trainers.model_card import plugin_distribution

    write_distribution(tmp_path, "reflect-lock-puzzle", example_entry_points(), version="0.2.0")
    monkeypatch.syspath_prepend(str(EXAMPLE_SRC))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(entry_points, "_WARNED", set())
    assert plugin_distribution("lock_puzzle") == "reflect-lock-puzzle 0.2.0"
    assert plugin_distribution("taxi") is None and plugin_distribution(None) is None
    facts = ModelCardFacts(
        model_name="rl", stage="rl", role="policy", model_dir="outputs/rl", env_name="lock_puzzle",
        env_distribution=plugin_distribution("lock_puzzle"), reflection_model="outputs/sft_reflection",
    )  # fmt: skip
    card = render_model_card(facts)
    assert (
        "provided by the plugin distribution `reflect-lock-puzzle 0.2.0` (`pip install reflect-lock-puzzle` to use "
        "this model)" in card
    )
    code = python_block(card)
    assert "# the environment comes from the plugin distribution 'reflect-lock-puzzle'" in code
    assert 'ReflectAgent.from_pretrained("outputs/rl", reflection="outputs/sft_reflection")' in code
    assert "taxi" not in render_model_card(
        ModelCardFacts("p", "sft", "policy", "out", env_name="taxi")
    ).split("**Environment:**")[1].split("\n")[0].replace("`taxi`", "")


def test_results_are_the_final_metrics():
    history = [
        {"step": 1, "stage/pickup/success_rate": 0.0, "env/success_rate": 0.0},
        {"step": 2, "stage/pickup/success_rate": 1.0, "env/success_rate": 1.0},
        {"step": 3, "stage/full/success_rate": 0.25, "env/success_rate": 0.25, "loss": 1.0},
    ]
    assert rl_results(history, last=1) == {
        "stage/pickup/success_rate": 1.0,
        "stage/full/success_rate": 0.25,
        "env/success_rate": 0.25,
    }
    assert rl_results(history, last=5)["stage/pickup/success_rate"] == 0.5
    sft = [{"eval_option_accuracy": 0.5, "step": 1}, {"eval_option_accuracy": 0.75, "eval_loss": 0.1}]
    assert sft_results(sft) == {"eval_option_accuracy": 0.75, "eval_loss": 0.1}


@pytest.fixture(scope="module")
def taxi_data(tmp_path_factory):
    from reflect_trl.data.builder import DataBuilderConfig, build_datasets

    root = tmp_path_factory.mktemp("card_data")
    build_datasets(
        DataBuilderConfig(
            env_name="taxi",
            n_train_tasks=2,
            n_val_tasks=1,
            stages=["pickup"],
            output_dir=str(root),
            progress=False,
        )
    )
    return root / "taxi"


def test_sft_output_dir_gets_a_reflect_rl_card(tiny_llama_dir, taxi_data, tmp_path):
    from reflect_trl.cli.sft import run_sft_cli

    out = tmp_path / "sft_policy"
    run_sft_cli(
        [
            "--model_name_or_path", tiny_llama_dir, "--dataset_path", str(taxi_data / "policy_reflect"),
            "--output_dir", str(out), "--max_steps", "2", "--per_device_train_batch_size", "4",
            "--report_to", "none", "--use_cpu", "--save_strategy", "no", "--eval_num_policy_samples", "4",
        ]
    )  # fmt: skip
    card = (out / "README.md").read_text()
    assert f"**Base model:** `{tiny_llama_dir}` (a local directory)" in card
    assert "[None]" not in card and "huggingface.co/None" not in card
    assert "**Environment:** `taxi`, curriculum stages `pickup`" in card
    assert "**Stage / role:** SFT / policy" in card and "Reflect-RL: Two-Player Online RL" in card
    assert f"**Training data:** `{taxi_data / 'policy_reflect'}`" in card
    assert "**Prompts:** with a reflection" in card
    assert re.search(r"\| `eval_option_accuracy` \| \d+\.\d %", card)
    assert "reflect_trl_labels.json" in card
    assert "ReflectAgent.from_pretrained(" in card and python_block(card).count("import") == 2
    printed = run_snippet(card)  # plays 4 held-out episodes with the saved policy
    assert len(printed.splitlines()) == 5 and "'action'" in printed and "'probability'" in printed


def test_rl_card_names_the_environment_reflection_and_stage_success(tiny_llama_dir, tmp_path):
    from reflect_trl.envs import make_env
    from reflect_trl.models import load_causal_lm, load_tokenizer
    from reflect_trl.trainers.rl_config import ReflectPPOConfig
    from reflect_trl.trainers.rl_tasks import tasks_to_dataset
    from reflect_trl.trainers.rl_trainer import ReflectPPOTrainer

    env = make_env("taxi")
    tasks = [t for s in ("pickup", "dropoff") for t in env.make_tasks("train", 4, seed=0, difficulty=s)]
    args = ReflectPPOConfig(
        output_dir=str(tmp_path / "rl"),
        env_name="taxi",
        curriculum_stages="pickup,dropoff",
        max_steps=2,
        per_device_train_batch_size=2,
        num_generations=2,
        reflection_max_new_tokens=4,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
    )
    trainer = ReflectPPOTrainer(
        model=load_causal_lm(tiny_llama_dir),
        args=args,
        train_dataset=tasks_to_dataset(tasks),
        processing_class=load_tokenizer(tiny_llama_dir),
        reflection_model=load_causal_lm(tiny_llama_dir, trainable=False),
    )
    trainer.train()
    trainer.save_model()
    trainer.create_model_card()
    card = (tmp_path / "rl" / "README.md").read_text()
    assert "**Stage / role:** RL / policy" in card
    assert f"**Base model:** `{tiny_llama_dir}`" in card
    assert "curriculum stages `pickup`, `dropoff`" in card
    assert f"**Reflection model (frozen):** `{tiny_llama_dir}`" in card
    assert "`advantage_estimator`: gigpo" in card  # the default
    for stage in ("pickup", "dropoff"):
        assert re.search(rf"\| success rate, stage `{stage}` \| \d+\.\d %", card), stage
    assert "not a held-out evaluation" in card
    assert f'ReflectAgent.from_pretrained("{tmp_path / "rl"}", reflection="{tiny_llama_dir}")' in card
    printed = run_snippet(card)  # the policy and its reflection model play 4 episodes
    assert "'reflection'" in printed and len(printed.splitlines()) == 5
