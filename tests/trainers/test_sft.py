"""ReflectSFTTrainer on a tiny offline model and the toy LineWorld data (CPU, a few steps each)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from _toy_env import LineWorldEnv, LineWorldReflector, toy_prompts
from reflect_trl.cli.sft import ReflectSFTScriptArguments, resolve_sft_labels
from reflect_trl.data.builder import DataBuilderConfig, build_datasets
from reflect_trl.data.io import DatasetFormatError
from reflect_trl.prompts import (
    DEFAULT_LABELS,
    clean_reflection,
    label_token_ids,
    read_option_labels,
    write_option_labels,
)
from reflect_trl.reflection.model import ReflectionBatch, ReflectionModel
from reflect_trl.tracking import configure_tracking
from reflect_trl.trainers.curriculum_sampler import CurriculumOrderedSampler
from reflect_trl.trainers.sft_config import ReflectSFTConfig
from reflect_trl.trainers.sft_data import count_options
from reflect_trl.trainers.sft_trainer import ReflectSFTTrainer


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """Toy data sets, and a nano GPT-2 and a nano Llama whose tokenizers were trained on the toy prompts."""
    from reflect_trl.tiny_models import build_tiny_model

    root = tmp_path_factory.mktemp("sft")
    config = DataBuilderConfig(
        env_name="line_world",
        n_train_tasks=16,
        n_val_tasks=4,
        negative_prob=0.5,
        seed=0,
        output_dir=str(root / "data"),
        progress=False,
    )
    data = build_datasets(config, env=LineWorldEnv(), reflector=LineWorldReflector())
    model_dir = build_tiny_model(root / "model", arch="gpt2", preset="nano", texts=toy_prompts())
    llama_dir = build_tiny_model(root / "llama", arch="llama", preset="nano", texts=toy_prompts())
    return {"data": data, "model": str(model_dir), "llama_model": str(llama_dir), "root": root}


def sft_args(tmp_path: Path, **overrides) -> ReflectSFTConfig:
    values = dict(
        output_dir=str(tmp_path / "out"),
        max_steps=40,
        learning_rate=3e-3,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=16,
        logging_steps=10,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        eval_num_policy_samples=32,
        eval_num_reflection_samples=6,
        reflection_max_new_tokens=24,
        dataset_num_proc=None,
    )
    values.update(overrides)
    return ReflectSFTConfig(**values)


def tokenizer_of(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


@torch.no_grad()
def option_metrics_one_by_one(model, tokenizer, dataset: Dataset) -> tuple[float, float]:
    """(accuracy, mean NLL) of the oracle label, computed row by row without padding: the prompt's last-position
    logits at the offered labels' tokens, softmax over them."""
    correct, nll = 0, 0.0
    for row in dataset:
        ids = torch.tensor([tokenizer(row["prompt"])["input_ids"]])
        logits = model(input_ids=ids).logits[0, -1]
        offered = DEFAULT_LABELS[: row["num_options"]]
        log_probs = torch.log_softmax(logits[label_token_ids(tokenizer, offered)].double(), dim=-1)
        target = offered.index(row["completion"])
        correct += int(log_probs.argmax()) == target
        nll -= float(log_probs[target])
    return correct / len(dataset), nll / len(dataset)


def test_policy_sft_lowers_eval_loss_and_reports_option_accuracy(toy, tmp_path):
    data = toy["data"]["policy_reflect"]
    trainer = ReflectSFTTrainer(
        model=toy["model"],
        args=sft_args(tmp_path, eval_num_policy_samples=10_000),  # every validation row
        train_dataset=data["train"],
        eval_dataset=data["validation"],
        processing_class=tokenizer_of(toy["model"]),
    )
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    assert after["eval_loss"] < before["eval_loss"]
    for metrics in (before, after):
        assert 0.0 <= metrics["eval_option_accuracy"] <= 1.0
        assert metrics["eval_option_samples"] == min(32, len(data["validation"]))
        assert metrics["eval_option_nll"] > 0
    assert after["eval_option_nll"] < before["eval_option_nll"]
    # the metric also reaches the trainer's log history
    assert any("eval_option_accuracy" in entry for entry in trainer.state.log_history)
    # the batched, left-padded metric equals the row-by-row computation
    accuracy, nll = option_metrics_one_by_one(
        trainer.model.eval(), tokenizer_of(toy["model"]), data["validation"]
    )
    assert accuracy > 0.0 and after["eval_option_accuracy"] == pytest.approx(accuracy, abs=1e-9)
    assert after["eval_option_nll"] == pytest.approx(nll, rel=1e-4)


def test_reflection_metrics_score_known_generations(toy, tmp_path, monkeypatch):
    """With the reflection model's generations fixed, every reflection metric is an exact, known fraction."""
    rows = toy["data"]["reflection"]["validation"].select(range(6))
    trainer = ReflectSFTTrainer(
        model=toy["model"],
        args=sft_args(
            tmp_path, role="reflection", eval_num_reflection_samples=6, per_device_eval_batch_size=4
        ),
        train_dataset=toy["data"]["reflection"]["train"],
        eval_dataset=rows,
        processing_class=tokenizer_of(toy["model"]),
    )
    references = [clean_reflection(c) for c in rows["completion"]]
    actions = rows["action_text"]
    assert all(a in r for a, r in zip(actions, references, strict=True)), "the toy references name the action"
    planned = [  # (generated text, generated tokens, stopped)
        (f"I will {actions[0]} now", 5, True),  # names the action
        (references[1], 7, True),  # exact match (names the action too)
        ("zzz", 24, False),  # nothing, ran out of budget
        (references[3], 9, False),  # names the action; not an exact match: it did not stop
        ("", 1, True),  # stopped at once
        (actions[5], 3, True),  # names the action
    ]
    seen: list[str] = []

    def fake_generate(self, prompts, prompt_ids=None):
        assert isinstance(self, ReflectionModel) and not self.freeze and self.max_new_tokens == 24
        chunk = planned[len(seen) : len(seen) + len(prompts)]
        seen.extend(prompts)
        return ReflectionBatch(
            [t for t, _, _ in chunk], [n for _, n, _ in chunk], [s for _, _, s in chunk], [[] for _ in chunk]
        )

    monkeypatch.setattr(ReflectionModel, "generate", fake_generate)
    metrics = trainer.evaluate()
    assert seen == list(rows["prompt"])
    assert metrics["eval_reflection_samples"] == 6
    assert metrics["eval_reflection_names_action"] == pytest.approx(4 / 6)
    assert metrics["eval_reflection_exact_match"] == pytest.approx(1 / 6)
    assert metrics["eval_stop_rate"] == pytest.approx(4 / 6)
    assert metrics["eval_reflection_length"] == pytest.approx((5 + 7 + 24 + 9 + 1 + 3) / 6)


def test_checkpoint_model_card_cites_reflect_rl_and_records_the_labels(toy, tmp_path):
    trainer = ReflectSFTTrainer(
        model=toy["model"],
        args=sft_args(
            tmp_path, max_steps=2, save_strategy="steps", save_steps=2, option_labels=DEFAULT_LABELS[:5]
        ),
        train_dataset=toy["data"]["policy_reflect"]["train"],
        processing_class=tokenizer_of(toy["model"]),
    )
    trainer.train()
    card = (tmp_path / "out" / "README.md").read_text()
    assert "2402.12621" in card and "Reflect-RL: Two-Player Online RL Fine-Tuning for LMs" in card
    assert "@inproceedings{zhou2024reflectrl" in card and "Runlong Zhou" in card
    assert "2402.03300" not in card and "DeepSeekMath" not in card
    assert read_option_labels(tmp_path / "out" / "checkpoint-2") == DEFAULT_LABELS[:5]


def test_reflection_sft_reports_stop_rate(toy, tmp_path):
    data = toy["data"]["reflection"]
    trainer = ReflectSFTTrainer(
        model=toy["model"],
        args=sft_args(tmp_path, role="reflection", max_steps=25),
        train_dataset=data["train"],
        eval_dataset=data["validation"],
        processing_class=tokenizer_of(toy["model"]),
    )
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    assert after["eval_loss"] < before["eval_loss"]
    for metrics in (before, after):
        assert 0.0 <= metrics["eval_stop_rate"] <= 1.0
        assert 0.0 <= metrics["eval_reflection_exact_match"] <= metrics["eval_stop_rate"]
        assert 1 <= metrics["eval_reflection_length"] <= 24
        assert 0.0 <= metrics["eval_reflection_names_action"] <= 1.0
        assert metrics["eval_reflection_samples"] == 6


def test_lora_policy_sft_saves_an_adapter(toy, tmp_path):
    from peft import LoraConfig, PeftModel

    data = toy["data"]["policy_plain"]
    trainer = ReflectSFTTrainer(
        model=toy["model"],
        args=sft_args(tmp_path, max_steps=6, learning_rate=1e-2),
        train_dataset=data["train"],
        eval_dataset=data["validation"],
        processing_class=tokenizer_of(toy["model"]),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj"], task_type="CAUSAL_LM"),
    )
    assert isinstance(trainer.model, PeftModel)
    trainer.train()
    metrics = trainer.evaluate()
    assert "eval_option_accuracy" in metrics and "eval_loss" in metrics
    trainer.save_model(str(tmp_path / "adapter"))
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()


def test_role_and_column_checks(toy, tmp_path):
    data = toy["data"]
    tokenizer = tokenizer_of(toy["model"])
    with pytest.raises(DatasetFormatError, match=r"train_dataset, row 0: .*role='reflection'"):
        ReflectSFTTrainer(
            toy["model"],
            sft_args(tmp_path),
            train_dataset=data["reflection"]["train"],
            processing_class=tokenizer,
        )
    with pytest.raises(DatasetFormatError, match=r"row 0: .*stop marker.*role='policy'"):
        ReflectSFTTrainer(
            toy["model"],
            sft_args(tmp_path, role="reflection"),
            train_dataset=data["policy_plain"]["train"],
            processing_class=tokenizer,
        )
    missing = Dataset.from_list([{"prompt": "x\n# Action:\n", "answer": "A"}])
    with pytest.raises(DatasetFormatError, match=r"train_dataset: missing column\(s\) \['completion'\]"):
        ReflectSFTTrainer(toy["model"], sft_args(tmp_path), train_dataset=missing, processing_class=tokenizer)
    empty = Dataset.from_list(
        [{"prompt": "x\n# Action:\n", "completion": "A"}, {"prompt": "", "completion": "A"}]
    )
    with pytest.raises(DatasetFormatError, match=r"eval_dataset, row 1: field 'prompt' is empty"):
        ReflectSFTTrainer(
            toy["model"],
            sft_args(tmp_path),
            train_dataset=data["policy_plain"]["train"],
            eval_dataset=empty,
            processing_class=tokenizer,
        )
    beyond = Dataset.from_list([{"prompt": "s\n# Options:\nA. a\nB. b\n# Action:\n", "completion": "C"}])
    with pytest.raises(DatasetFormatError, match=r"label 'C' is beyond the 2 offered option"):
        ReflectSFTTrainer(toy["model"], sft_args(tmp_path), train_dataset=beyond, processing_class=tokenizer)


def test_curriculum_order_puts_easy_stages_first(toy, tmp_path):
    sampler = CurriculumOrderedSampler(["far", "near", "far", "near"], ["near", "far"], seed=1)
    order = list(sampler)
    assert sorted(order[:2]) == [1, 3] and sorted(order[2:]) == [0, 2]
    with pytest.raises(ValueError, match=r"difficulty value\(s\) \['far'\] are not among the stages"):
        CurriculumOrderedSampler(["far"], ["near"])
    data = toy["data"]["policy_reflect"]["train"]
    trainer = ReflectSFTTrainer(
        toy["model"],
        sft_args(tmp_path, curriculum_order=True, stages=["far", "near"]),
        train_dataset=data,
        processing_class=tokenizer_of(toy["model"]),
    )
    indices = list(trainer._get_train_sampler())
    difficulties = [data[i]["difficulty"] for i in indices]
    n_far = difficulties.count("far")
    assert difficulties == ["far"] * n_far + ["near"] * (len(data) - n_far)


def test_cpu_defaults_and_config_checks(tmp_path):
    args = ReflectSFTConfig(output_dir=str(tmp_path), use_cpu=True)
    assert args.bf16 is False and args.gradient_checkpointing is False
    assert args.labels[:3] == ("A", "B", "C")
    assert ReflectSFTConfig(output_dir=str(tmp_path), use_cpu=True, option_labels="xyz").labels == (
        "x",
        "y",
        "z",
    )
    with pytest.raises(ValueError, match="role must be one of"):
        ReflectSFTConfig(output_dir=str(tmp_path), use_cpu=True, role="critic")
    assert ReflectSFTConfig(output_dir=str(tmp_path), use_cpu=True, warmup_ratio=0.1).warmup_steps == 0.1
    for value in ("1,2,3", ["1", "2", "3"], "123", '["1", "2", "3"]'):
        assert ReflectSFTConfig(output_dir=str(tmp_path), use_cpu=True, option_labels=value).labels == (
            "1",
            "2",
            "3",
        )
    with pytest.raises(ValueError, match="distinct"):
        ReflectSFTConfig(output_dir=str(tmp_path), use_cpu=True, option_labels="ABA")


def test_sft_labels_come_from_the_config_else_the_data_set_else_the_defaults(tmp_path):
    data_dir = tmp_path / "data" / "toy"
    (data_dir / "policy").mkdir(parents=True)
    script_args = ReflectSFTScriptArguments(dataset_path=str(data_dir / "policy"))

    def resolved(option_labels=None) -> tuple[str, ...]:
        args = ReflectSFTConfig(output_dir=str(tmp_path / "out"), use_cpu=True, option_labels=option_labels)
        labels = resolve_sft_labels(script_args, args)
        assert args.labels == labels
        return labels

    assert resolved() == DEFAULT_LABELS  # nothing recorded
    assert resolved("x,y") == ("x", "y")
    write_option_labels(data_dir, ["1", "2", "3"])
    assert resolved() == ("1", "2", "3")
    assert resolved("123") == ("1", "2", "3")
    with pytest.raises(ValueError, match="differ from the labels"):
        resolved("ABC")
    script_args.dataset_path = "org/hub-dataset"  # not local: nothing recorded
    assert resolved("ABC") == ("A", "B", "C")


def test_wandb_runs_offline_by_default(tmp_path, monkeypatch):
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    assert configure_tracking("none", tmp_path) == {}
    changed = configure_tracking(["wandb"], tmp_path / "run")
    assert changed["WANDB_MODE"] == "offline"
    assert Path(changed["WANDB_DIR"]) == (tmp_path / "run").resolve()
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", "x")
    assert "WANDB_MODE" not in configure_tracking(["wandb"], tmp_path)


def test_count_options():
    assert count_options("s\n# Options:\nA. a\nB. b\nC. c\n# Action:\n") == 3
    assert count_options("s\n# Action:\n") == 0


def test_run_sft_cli_trains_saves_and_writes_metrics(toy, tmp_path):
    from reflect_trl.cli.sft import run_sft_cli

    data_file = toy["root"] / "data" / "line_world" / "policy_reflect.jsonl"
    out = tmp_path / "run"
    metrics = run_sft_cli(
        [
            "--model_name_or_path", toy["model"],
            "--dataset_path", str(data_file),
            "--output_dir", str(out),
            "--max_steps", "4",
            "--per_device_train_batch_size", "8",
            "--report_to", "none",
            "--use_cpu", "--bf16", "false",
            "--save_strategy", "no",
            "--eval_num_policy_samples", "8",
        ]
    )  # fmt: skip
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    written = json.loads((out / "sft_metrics.json").read_text())
    assert written["role"] == "policy" and "eval_option_accuracy" in written and "eval_loss" in written
    assert written["train_rows"] == len(toy["data"]["policy_reflect"]["train"]) == metrics["train_rows"]
    # trainer.save_metrics / save_state
    assert (
        json.loads((out / "eval_results.json").read_text())["eval_option_accuracy"]
        == written["eval_option_accuracy"]
    )
    assert json.loads((out / "train_results.json").read_text())["train_loss"] == written["train_loss"]
    assert {"train_loss", "eval_loss"} <= set(json.loads((out / "all_results.json").read_text()))
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 4
    # the labels recorded next to the data set travel to the policy
    assert read_option_labels(data_file.parent) == DEFAULT_LABELS == read_option_labels(out)
    with pytest.raises(ValueError, match="differ from the labels"):
        run_sft_cli(["--model_name_or_path", toy["model"], "--dataset_path", str(data_file),
                     "--output_dir", str(tmp_path / "bad"), "--option_labels", "12345", "--use_cpu"])  # fmt: skip


@pytest.mark.parametrize("model_kind", ["gpt2", "llama"])
@pytest.mark.parametrize("dataset", ["reflection", "policy_reflect"])
def test_prompt_context_gives_the_plain_loss_gradients_and_metrics(toy, tmp_path, dataset, model_kind):
    """Each row's prompt is encoded into a KV cache first (the rows' common prefix once, at batch size 1) and the
    fused LM head runs on the trained tails only: the loss forward sees one column per tail token, and the loss,
    the gradients and TRL's metrics (token accuracy, entropy, token count) equal those of the plain batch
    (``shared_prefix_min_tokens=0``)."""
    data = toy["data"][dataset]["train"]
    model_dir = toy["model"] if model_kind == "gpt2" else toy["llama_model"]
    results = {}
    for min_tokens in (8, 0):
        trainer = ReflectSFTTrainer(
            model=model_dir,
            args=sft_args(
                tmp_path / str(min_tokens),
                shared_prefix_min_tokens=min_tokens,
                role="reflection" if dataset == "reflection" else "policy",
            ),
            train_dataset=data,
            processing_class=tokenizer_of(model_dir),
        )
        batch = next(iter(trainer.get_train_dataloader()))
        calls: list[tuple[int, int]] = []
        hook = trainer.model.register_forward_pre_hook(
            lambda _m, args, kwargs, _c=calls: _c.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
        )
        trainer.model.eval()  # no dropout: both forwards are deterministic (gradients still flow)
        loss = trainer.compute_loss(trainer.model, dict(batch))
        hook.remove()
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        metrics = {k: v[-1] for k, v in trainer._metrics["eval"].items()}
        results[min_tokens] = (
            calls,
            loss.detach(),
            torch.autograd.grad(loss, params, allow_unused=True),
            metrics,
        )
    (
        (shared_calls, shared_loss, shared_grads, shared_metrics),
        (plain_calls, plain_loss, plain_grads, plain_metrics),
    ) = (
        results[8],
        results[0],
    )
    rows, width = batch["input_ids"].shape
    lengths = batch["attention_mask"].sum(-1)
    first_trained = (batch["labels"] != -100).int().argmax(-1)
    assert plain_calls == [(rows, width)]
    # prefix at batch size 1, the rest of the prompts, then the tails: first_trained - 1 .. end of each row
    assert shared_calls[0][0] == 1 and shared_calls[0][1] >= 8
    assert shared_calls[-1] == (rows, int((lengths - first_trained + 1).max()))
    assert shared_calls[-1][1] < width
    assert shared_loss.item() == pytest.approx(plain_loss.item(), rel=1e-5)
    for g, w in zip(shared_grads, plain_grads, strict=True):
        if w is not None:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    assert set(shared_metrics) == set(plain_metrics) >= {"mean_token_accuracy", "entropy", "num_tokens"}
    for key, value in plain_metrics.items():
        assert shared_metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    with pytest.raises(ValueError, match="shared_prefix_min_tokens must be >= 0"):
        sft_args(tmp_path, shared_prefix_min_tokens=-1)


def test_prompt_context_is_off_with_activation_checkpointing(toy, tmp_path):
    """Checkpointing re-runs layers without their KV cache: asked for in the args or already on in the model, the
    loss takes the plain batch under autograd (and the trained tails without gradients)."""
    data = toy["data"]["policy_reflect"]["train"]
    for args_flag in (True, False):
        trainer = ReflectSFTTrainer(
            model=toy["llama_model"],
            args=sft_args(tmp_path / str(args_flag), role="policy", gradient_checkpointing=args_flag),
            train_dataset=data,
            processing_class=tokenizer_of(toy["llama_model"]),
        )
        if not args_flag:
            trainer.model.gradient_checkpointing_enable()
        batch = next(iter(trainer.get_train_dataloader()))
        assert trainer._encode_prompt_context(trainer.model, dict(batch))["input_ids"] is batch["input_ids"]
        with torch.no_grad():
            narrow = trainer._encode_prompt_context(trainer.model, dict(batch))["input_ids"]
        assert narrow.shape[1] < batch["input_ids"].shape[1]


def test_label_matched_steps_show_as_many_rows_as_the_matched_run_used(tmp_path):
    from reflect_trl.cli.sft import label_matched_steps
    from reflect_trl.errors import UsageError
    from reflect_trl.trainers.sft_config import ReflectSFTConfig

    run = tmp_path / "rl_reflection_only_verified"
    run.mkdir()
    (run / "reflection_labels.json").write_text(json.dumps({"oracle_labelled_turns": 1001}))
    args = ReflectSFTConfig(
        output_dir=str(tmp_path / "o"),
        per_device_train_batch_size=16,
        gradient_accumulation_steps=2,
        use_cpu=True,
    )
    assert label_matched_steps(str(run), args) == 32  # ceil(1001 / 32)
    with pytest.raises(
        UsageError, match=r"match_oracle_labels_of: cannot read the oracle-labelled turns from .*nowhere"
    ):
        label_matched_steps(str(tmp_path / "nowhere"), args)
