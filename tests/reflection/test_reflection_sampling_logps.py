"""A trained reflection player's sampling log-probs (its PPO ratio's denominator) are the training forward's, even
when the checkpoint's ``generation_config`` switches logits processors on (repetition penalty, n-gram blocking,
minimum length, ...): those are left out of sampling too, so what is sampled is what is trained."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from reflect_trl.prompts import reflection_prompt
from reflect_trl.reflection.model import ReflectionModel
from reflect_trl.trainers.reflection_learner import ReflectionLearner
from reflect_trl.trainers.rl_batch import collate_reflections

PROMPTS = [
    reflection_prompt("Taxi at row 2, col 2. Passenger waiting at row 0, col 4."),
    reflection_prompt("Taxi at row 4, col 3."),
    reflection_prompt("Goal: drive to the passenger and pick them up.\nTaxi at row 1, col 0."),
    reflection_prompt("Taxi at row 0, col 0. Passenger in the taxi. Destination at row 4, col 4."),
]

# processors a chat checkpoint's generation_config commonly switches on
INHERITED = dict(repetition_penalty=1.5, no_repeat_ngram_size=2, min_new_tokens=3, top_k=5, do_sample=True)


def _models(model_dir: str, **generation):
    """The tiny model with ``generation`` in its generation_config, as a learning reflection player, and its
    learner (the training forward)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    # sharper next-token distributions than a random init's, for the processors to matter
    with torch.no_grad():
        model.transformer.ln_f.weight.mul_(8.0)
    for key, value in generation.items():
        setattr(model.generation_config, key, value)
    learner = ReflectionLearner(torch.nn.Module(), model, tok)
    model.eval()
    return model, tok, learner


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("shared_prefix", [0, 8])
def test_first_epoch_ratio_is_one_despite_inherited_logits_processors(
    tiny_model_dir, temperature, shared_prefix
):
    model, tok, learner = _models(tiny_model_dir, **INHERITED)
    player = ReflectionModel(
        model,
        tok,
        max_new_tokens=8,
        temperature=temperature,
        freeze=False,
        record_tokens=True,
        shared_prefix_min_tokens=shared_prefix,
    )
    torch.manual_seed(0)
    batch = player.generate(PROMPTS)
    rows = [
        SimpleNamespace(reflection_prompt_ids=p, reflection_ids=t, reflection_logps=lp, real=True)
        for p, t, lp in zip(batch.prompt_ids, batch.token_ids, batch.token_logps, strict=True)
    ]
    inputs = collate_reflections(rows, tok.pad_token_id, "cpu")
    tokens = inputs["reflection_token_mask"]
    assert tokens.sum() >= len(PROMPTS)
    with torch.no_grad():
        logp, _ = learner.token_logps(model, inputs, temperature)
    ratio = torch.exp(logp - inputs["old_reflection_logps"])[tokens.bool()]
    torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=1e-4)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_inherited_logits_processors_do_not_shape_the_reflections(tiny_model_dir, temperature):
    """The same reflections (greedy, or sampled from one seed) as from the model with a clean generation_config."""
    penalised, tok, _ = _models(tiny_model_dir, **INHERITED)
    clean, _, _ = _models(tiny_model_dir)
    texts = []
    for model in (penalised, clean):
        torch.manual_seed(0)
        player = ReflectionModel(model, tok, max_new_tokens=8, temperature=temperature, freeze=False)
        texts.append(player.generate(PROMPTS).texts)
    assert texts[0] == texts[1]
