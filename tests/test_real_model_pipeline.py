"""A real pretrained model through every stage (slow): SmolLM2-135M-Instruct, converted by `make real-model`, on
DangerousTaxi at smoke sizes with its own tokenizer: data -> SFT of both players with LoRA -> RL (frozen reflection
player, then `train_reflection`) -> evaluation with transcripts, all through the `reflect-trl` entry points.

What a real tokenizer can break, and is checked here: every option label is one token right after the action cue,
at the position the policy scores; the prompts are plain text in SFT, RL and evaluation alike (SmolLM2's tokenizer
carries a chat template, and no stage applies it), and the rollout's piecewise prompt ids equal the whole prompt's;
all-linear LoRA finds the Llama layers; the saved adapters reload. The model folder comes from the same conversion
as `make real-model` (skipped, with the reason, only when it cannot be produced).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reflect_trl import prompts as prompts_module
from reflect_trl import rollout
from reflect_trl.cli import main
from reflect_trl.models import load_causal_lm, load_tokenizer
from reflect_trl.prompts import ACTION_CUE, LABELS_FILE, encode_prompts, label_token_ids, read_option_labels
from reflect_trl.real_model import DEFAULT_OUTPUT_DIR, RealModelError, ensure_real_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[1]
LLAMA_LINEAR = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
#: Short episodes keep the real model's rollouts to a few turns (no step cost, as the validated RL recipe).
ENV_KWARGS = json.dumps({"step_reward": 0, "horizon": 3})
COMMON = [
    "--use_cpu",
    "true",
    "--bf16",
    "false",
    "--report_to",
    "none",
    "--save_strategy",
    "no",
    "--seed",
    "0",
]


@pytest.fixture(scope="module")
def model_dir() -> str:
    try:
        return str(ensure_real_model(REPO / DEFAULT_OUTPUT_DIR))
    except RealModelError as err:
        pytest.skip(f"the real model folder cannot be produced: {err}")


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("real-model")


def _run(argv: list[str]) -> None:
    assert main(["--no-progress", *argv]) == 0, argv


def _sft(model_dir: str, data: Path, role: str, out: Path) -> None:
    dataset = data / ("policy_reflect" if role == "policy" else "reflection")
    _run(
        ["sft", "--model_name_or_path", model_dir, "--dataset_path", str(dataset), "--env_name", "taxi"]
        + [
            "--role",
            role,
            "--output_dir",
            str(out),
            "--use_peft",
            "true",
            "--lora_r",
            "8",
            "--lora_alpha",
            "16",
        ]
        + ["--max_steps", "2", "--per_device_train_batch_size", "2", "--learning_rate", "1e-4"]
        + ["--max_length", "1024", "--eval_strategy", "no", "--logging_steps", "1", "--disable_tqdm", "true"]
        + ["--max_eval_samples", "4", "--eval_num_policy_samples", "4", "--eval_num_reflection_samples", "2"]
        + ["--reflection_max_new_tokens", "8", *COMMON]
    )


@pytest.fixture(scope="module")
def stages(model_dir: str, work: Path) -> dict[str, Path]:
    """Every stage once (module scope: the tests below read what they wrote)."""
    _run(
        ["data", "--env_name", "taxi", "--n_train_tasks", "2", "--n_val_tasks", "1", "--seed", "0"]
        + ["--output_dir", str(work / "data"), "--tokenizer_name_or_path", model_dir]
    )
    data = work / "data" / "taxi"
    runs = {name: work / name for name in ("sft_reflection", "sft_policy", "rl", "rl_reflect", "eval")}
    _sft(model_dir, data, "reflection", runs["sft_reflection"])
    _sft(model_dir, data, "policy", runs["sft_policy"])
    rl = (
        [
            "rl",
            "--model_name_or_path",
            str(runs["sft_policy"]),
            "--env_name",
            "taxi",
            "--env_kwargs",
            ENV_KWARGS,
        ]
        + ["--reflection_model_name_or_path", str(runs["sft_reflection"]), "--reflection_max_new_tokens", "8"]
        + ["--max_steps", "1", "--per_device_train_batch_size", "4", "--num_generations", "2"]
        + [
            "--curriculum_stages",
            "pickup",
            "--num_iterations",
            "1",
            "--learning_rate",
            "1e-4",
            "--advantage_estimator",
            "gigpo",
            "--gamma",
            "1.0",
        ]
        + [
            "--beta",
            "0.05",
            "--replay_buffer_size",
            "0",
            "--num_train_tasks",
            "4",
            "--logging_steps",
            "1",
            *COMMON,
        ]
    )
    _run([*rl, "--output_dir", str(runs["rl"]), "--reflection_temperature", "0"])
    _run(
        [*rl, "--output_dir", str(runs["rl_reflect"]), "--train_reflection", "true"]
        + ["--reflection_temperature", "1.0", "--reflection_learning_rate", "1e-4"]
    )
    _run(
        [
            "eval",
            "--policy",
            str(runs["rl"]),
            "--reflection",
            str(runs["sft_reflection"]),
            "--name",
            "reflect-rl",
        ]
        + ["--policy", "random", "--name", "random", "--env_name", "taxi", "--env_kwargs", ENV_KWARGS]
        + ["--stages", "pickup", "--decodings", "greedy", "--episodes_per_stage", "2", "--batch_size", "2"]
        + ["--reflection_max_new_tokens", "8", "--device", "cpu", "--output_dir", str(runs["eval"])]
    )
    return {"data": data, **runs}


@pytest.fixture(scope="module")
def encoded() -> dict[str, list]:
    """Every prompt the rollouts of RL and evaluation tokenize whole, and every policy prompt's ids (spied)."""
    return {"whole": [], "policy": []}


@pytest.fixture(scope="module", autouse=True)
def _spy(encoded):
    """Record what the rollout engine tokenizes (RL and evaluation both play through it)."""
    mp = pytest.MonkeyPatch()
    original_policy_ids = rollout.RolloutEngine._policy_ids

    def policy_ids(self, heads, suffixes, full):
        ids = original_policy_ids(self, heads, suffixes, full)
        encoded["policy"].extend(zip(full, ids, strict=True))
        return ids

    def encode(tokenizer, texts):
        ids = prompts_module.encode_prompts(tokenizer, texts)
        encoded["whole"].extend(zip(texts, ids, strict=True))
        return ids

    mp.setattr(rollout.RolloutEngine, "_policy_ids", policy_ids)
    mp.setattr(rollout, "encode_prompts", encode)
    yield
    mp.undo()


def test_option_labels_are_single_tokens_where_the_policy_scores_them(model_dir, stages):
    tokenizer = load_tokenizer(model_dir)
    labels = read_option_labels(stages["sft_policy"])
    assert labels is not None and (stages["rl"] / LABELS_FILE).is_file()
    ids = label_token_ids(tokenizer, labels)  # raises unless each label is one distinct token after the cue
    cue = tokenizer(ACTION_CUE, add_special_tokens=False)["input_ids"]
    rows = [json.loads(x) for x in (stages["data"] / "policy_reflect.jsonl").read_text().splitlines()][:20]
    for row in rows:
        prompt_ids = encode_prompts(tokenizer, [row["prompt"]])[0]
        assert prompt_ids[-len(cue) :] == cue  # the policy scores the position right after the cue
        label = labels.index(row["completion"].strip())
        assert encode_prompts(tokenizer, [row["prompt"] + labels[label]])[0] == prompt_ids + [ids[label]]


def test_sft_rl_and_eval_prompts_are_the_same_plain_text(model_dir, stages, encoded):
    """SmolLM2 ships a chat template; no stage applies it, and each stage feeds the ids of the plain prompt."""
    from datasets import load_from_disk

    from reflect_trl.trainers.sft_config import ReflectSFTConfig
    from reflect_trl.trainers.sft_trainer import ReflectSFTTrainer

    tokenizer = load_tokenizer(model_dir)
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    # SFT: the trainer's own tokenization of policy rows is the plain prompt, then the label
    raw = load_from_disk(str(stages["data"] / "policy_reflect"))["train"].select(range(4))
    trainer = ReflectSFTTrainer(
        model=load_causal_lm(model_dir),
        args=ReflectSFTConfig(
            output_dir=str(stages["data"] / "scratch"),
            role="policy",
            use_cpu=True,
            bf16=False,
            report_to="none",
        ),
        train_dataset=raw.select_columns(["prompt", "completion", "num_options"]),
        processing_class=tokenizer,
    )
    labels = trainer.args.labels
    label_ids = label_token_ids(tokenizer, labels)
    for row, tokenized in zip(raw, trainer.train_dataset, strict=True):
        prompt_ids = encode_prompts(tokenizer, [row["prompt"]])[0]
        assert tokenized["input_ids"][: len(prompt_ids)] == prompt_ids
        assert tokenized["input_ids"][len(prompt_ids)] == label_ids[labels.index(row["completion"].strip())]
    # RL and evaluation: every policy prompt the rollouts built, plain text, with the ids of the whole text
    read = [(text, ids) for text, ids in encoded["policy"] if ids]  # the scripted `random` reads no ids
    assert read, "no policy prompt was recorded"
    for text, ids in read + encoded["whole"]:
        assert "<|im_start|>" not in text and not text.startswith("<")
        assert ids == tokenizer(text)["input_ids"]
    assert any(text.endswith(ACTION_CUE) and "# Reflection:\n" in text for text, _ in read)


def test_lora_found_the_llama_layers_and_the_adapters_reload(stages):
    for run in ("sft_reflection", "sft_policy", "rl"):
        config = json.loads((stages[run] / "adapter_config.json").read_text())
        assert set(config["target_modules"]) == LLAMA_LINEAR, run
        model = load_causal_lm(str(stages[run]), trainable=False)
        assert type(model.get_base_model()).__name__ == "LlamaForCausalLM"
        assert sum("lora_A" in n for n, _ in model.named_parameters()) == 7 * 30  # 7 layers x 30 blocks
    merged = load_causal_lm(str(stages["sft_reflection"]), trainable=False, merge_adapter=True)
    assert type(merged).__name__ == "LlamaForCausalLM"
    # the reflection player that learned in RL is saved apart and reloads too (a full copy today: the trainer gives the
    # reflection learner no LoRA config when the policy continues its SFT adapter)
    learned = load_causal_lm(str(stages["rl_reflect"] / "reflection"), trainable=False)
    assert type(learned).__name__ == "LlamaForCausalLM"


def test_rl_ran_both_ways_and_eval_wrote_transcripts(stages):
    for run in ("rl", "rl_reflect"):
        history = json.loads((stages[run] / "log_history.json").read_text())
        assert any("env/success_rate" in h for h in history), run
        assert any("loss" in h for h in history), run
    reflect_logs = json.loads((stages["rl_reflect"] / "log_history.json").read_text())
    assert any(k.startswith("reflection/") for h in reflect_logs for k in h)
    results = json.loads((stages["eval"] / "results.json").read_text())
    assert "reflect-rl" in json.dumps(results) and "random" in json.dumps(results)
    transcripts = sorted((stages["eval"] / "transcripts").glob("*.jsonl"))
    assert transcripts and all(p.read_text().strip() for p in transcripts)
