"""Tiny causal LMs and tokenizers built offline (no hub access), for tests, the demo and benchmarks.

The tokenizer is a byte-level BPE trained with the ``tokenizers`` library on text rendered by the
environments themselves (prompts, options, reflections), so its vocabulary covers what the models read and
write; the option labels and the reflection stop marker are single tokens. Everything is deterministic for a
seed, saved with ``save_pretrained`` and loadable with ``AutoModelForCausalLM`` / ``AutoTokenizer``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

from reflect_trl.prompts import DEFAULT_LABELS, STOP_MARKER, build_prompt

ARCHITECTURES = ("gpt2", "llama")
SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>", STOP_MARKER]
PRESETS: dict[str, dict[str, int]] = {
    # name: hidden size, layers, heads, vocab, context
    "nano": {"hidden": 32, "layers": 1, "heads": 2, "vocab": 1024, "context": 1024},
    "tiny": {"hidden": 64, "layers": 2, "heads": 2, "vocab": 2048, "context": 1024},
    "small": {"hidden": 128, "layers": 4, "heads": 4, "vocab": 4096, "context": 2048},
}


def default_corpus(envs: Sequence[str] = ("taxi",), n_tasks: int = 40, seed: int = 0) -> list[str]:
    """Text rendered by the environments (state, options, oracle reflections) to train the tokenizer on."""
    from reflect_trl.envs import make_env
    from reflect_trl.reflection import ReflectionContext, get_oracle_reflector

    rng = random.Random(seed)
    lines: list[str] = []
    for name in envs:
        env = make_env(name)
        try:
            reflector = get_oracle_reflector(name)
        except (
            KeyError
        ):  # no oracle reflector for this env (a broken plugin raises PluginLoadError: not hidden)
            reflector = None
        for task in env.make_tasks("train", n_tasks, seed=seed):
            obs = env.reset(task=task)
            previous, last = None, None
            for step in range(env.horizon):
                oracle = env.oracle_action()
                reflection = ""
                if reflector is not None:
                    ctx = ReflectionContext(env, obs, step, oracle, previous, last, True)
                    reflection = reflector.reflect(ctx, rng)
                lines.append(build_prompt(obs.text, obs.actions, reflection).text)
                action = oracle if rng.random() < 0.7 else rng.randrange(len(obs.actions))
                previous, last = obs, obs.actions[action]
                obs, _, terminated, truncated, _ = env.step(action)
                if terminated or truncated:
                    break
    return lines


def build_tokenizer(texts: Iterable[str], vocab_size: int = 2048):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``texts`` (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    # Labels and digits must exist as single tokens whatever the corpus says.
    texts = list(texts) + [" ".join(DEFAULT_LABELS)]
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<eos>",
        bos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=[STOP_MARKER],
    )
    fast.padding_side = "left"
    fast.truncation_side = "left"
    return fast


def build_model_config(arch: str, tokenizer, preset: str = "tiny"):
    from transformers import GPT2Config, LlamaConfig

    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {ARCHITECTURES}")
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    p = PRESETS[preset]
    common = dict(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if arch == "gpt2":
        return GPT2Config(
            n_embd=p["hidden"], n_layer=p["layers"], n_head=p["heads"], n_positions=p["context"], **common
        )
    return LlamaConfig(
        hidden_size=p["hidden"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["heads"],
        intermediate_size=2 * p["hidden"],
        max_position_embeddings=p["context"],
        tie_word_embeddings=False,
        **common,
    )


def build_tiny_model(
    output_dir: str | Path,
    arch: str = "gpt2",
    preset: str = "tiny",
    seed: int = 0,
    envs: Sequence[str] = ("taxi",),
    texts: Iterable[str] | None = None,
) -> Path:
    """Build and save a randomly initialised tiny causal LM + tokenizer to ``output_dir``; return the path."""
    import torch
    from transformers import AutoModelForCausalLM

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    corpus = list(texts) if texts is not None else default_corpus(envs, seed=seed)
    tokenizer = build_tokenizer(corpus, vocab_size=PRESETS[preset]["vocab"] if preset in PRESETS else 2048)
    config = build_model_config(arch, tokenizer, preset)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    meta = {
        "arch": arch,
        "preset": preset,
        "seed": seed,
        "envs": list(envs),
        "params": model.num_parameters(),
    }
    (output_dir / "reflect_trl_tiny.json").write_text(json.dumps(meta, indent=2) + "\n")
    return output_dir
