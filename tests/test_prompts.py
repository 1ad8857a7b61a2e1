"""The prompt builder: exact layout, seeded option shuffling, label validation against a tokenizer."""

from __future__ import annotations

import re

import pytest

from reflect_trl.envs import make_env
from reflect_trl.prompts import (
    ACTION_CUE,
    DEFAULT_LABELS,
    STOP_MARKER,
    build_prompt,
    clean_reflection,
    count_option_lists,
    label_token_ids,
    option_order,
    options_block,
    prompt_options,
    reflection_prompt,
    with_stop,
)

TAXI_ACTIONS = (
    "move south",
    "move north",
    "move east",
    "move west",
    "pickup passenger",
    "drop off passenger",
)
STATE = (
    "Goal: drive to the passenger and pick them up.\n"
    "+---------+\n"
    "| : | : :P|\n"
    "| : | : : |\n"
    "| : :T: : |\n"
    "| | : | : |\n"
    "| | : |D: |\n"
    "+---------+\n"
    "Taxi at row 2, col 2. Passenger waiting at row 0, col 4. Destination at row 4, col 3.\n"
    "Actions so far: none.\n\n"  # trailing whitespace is stripped by the builder
)
STATE_STRIPPED = STATE.rstrip()
OPTIONS_TEXT = (
    "# Options:\n"
    "A. move south\n"
    "B. move north\n"
    "C. move east\n"
    "D. move west\n"
    "E. pickup passenger\n"
    "F. drop off passenger\n"
    "# Action:\n"
)


# -- golden layout ------------------------------------------------------------------------------------------
def test_golden_prompt_without_reflection():
    prompt = build_prompt(STATE, TAXI_ACTIONS)
    assert prompt.text == STATE_STRIPPED + "\n" + OPTIONS_TEXT
    assert prompt.text == (
        "Goal: drive to the passenger and pick them up.\n"
        "+---------+\n"
        "| : | : :P|\n"
        "| : | : : |\n"
        "| : :T: : |\n"
        "| | : | : |\n"
        "| | : |D: |\n"
        "+---------+\n"
        "Taxi at row 2, col 2. Passenger waiting at row 0, col 4. Destination at row 4, col 3.\n"
        "Actions so far: none.\n"
        "# Options:\n"
        "A. move south\n"
        "B. move north\n"
        "C. move east\n"
        "D. move west\n"
        "E. pickup passenger\n"
        "F. drop off passenger\n"
        "# Action:\n"
    )
    assert prompt.labels == ("A", "B", "C", "D", "E", "F")
    assert prompt.order == (0, 1, 2, 3, 4, 5)
    assert prompt.num_options == 6


def test_golden_prompt_with_reflection():
    reflection = "  The passenger is north-east; move east twice, then north.\n"
    prompt = build_prompt(STATE, TAXI_ACTIONS, reflection)
    assert prompt.text == (
        "Goal: drive to the passenger and pick them up.\n"
        "+---------+\n"
        "| : | : :P|\n"
        "| : | : : |\n"
        "| : :T: : |\n"
        "| | : | : |\n"
        "| | : |D: |\n"
        "+---------+\n"
        "Taxi at row 2, col 2. Passenger waiting at row 0, col 4. Destination at row 4, col 3.\n"
        "Actions so far: none.\n"
        "# Reflection:\n"
        "The passenger is north-east; move east twice, then north.<end>\n"
        "# Options:\n"
        "A. move south\n"
        "B. move north\n"
        "C. move east\n"
        "D. move west\n"
        "E. pickup passenger\n"
        "F. drop off passenger\n"
        "# Action:\n"
    )
    # The reflection model's prompt is an exact prefix of the policy prompt.
    assert prompt.text.startswith(reflection_prompt(STATE))
    assert reflection_prompt(STATE) == STATE_STRIPPED + "\n# Reflection:\n"


def test_empty_reflection_keeps_the_section():
    prompt = build_prompt("s", ("go",), "")
    assert prompt.text == "s\n# Reflection:\n<end>\n# Options:\nA. go\n# Action:\n"


def test_prompt_of_a_real_taxi_observation():
    env = make_env("taxi")
    task = env.make_tasks("train", 1, seed=0, difficulty="pickup")[0]
    obs = env.reset(task=task)
    assert "# Options:" not in obs.text, "observations must not contain the options block"
    assert obs.actions == TAXI_ACTIONS
    plain = build_prompt(obs.text, obs.actions)
    assert plain.text == obs.text.rstrip() + "\n" + OPTIONS_TEXT
    reflected = build_prompt(obs.text, obs.actions, "go east")
    assert reflected.text == obs.text.rstrip() + "\n# Reflection:\ngo east<end>\n" + OPTIONS_TEXT


# -- shuffling ----------------------------------------------------------------------------------------------
def test_seeded_shuffle_is_deterministic_and_consistent():
    a = build_prompt(STATE, TAXI_ACTIONS, shuffle_seed=123)
    b = build_prompt(STATE, TAXI_ACTIONS, shuffle_seed=123)
    assert a == b
    assert sorted(a.order) == list(range(6))
    orders = {build_prompt(STATE, TAXI_ACTIONS, shuffle_seed=s).order for s in range(20)}
    assert len(orders) > 5, "different seeds should give different orders"
    assert a.order == option_order(6, 123)
    for option in range(a.num_options):
        action = a.action_index(option)
        assert a.option_of(action) == option
        assert f"{a.labels[option]}. {TAXI_ACTIONS[action]}\n" in a.text
    # The text lists the options in prompt order.
    lines = a.text.split("# Options:\n", 1)[1].split("# Action:", 1)[0].splitlines()
    assert lines == [f"{DEFAULT_LABELS[i]}. {TAXI_ACTIONS[a.order[i]]}" for i in range(6)]


def test_no_shuffle_is_identity():
    assert option_order(4, None) == (0, 1, 2, 3)
    assert options_block(["x", "y"], ["A", "B"], [1, 0]) == "# Options:\nA. y\nB. x\n# Action:\n"


def test_prompt_options_reads_back_the_shown_options_and_counts_distinct_lists():
    fixed = build_prompt(STATE, TAXI_ACTIONS, "Next I will move north.")
    shuffled = build_prompt(STATE, TAXI_ACTIONS, "Next I will move north.", shuffle_seed=123)
    assert prompt_options(fixed.text) == TAXI_ACTIONS
    assert prompt_options(shuffled.text) == tuple(TAXI_ACTIONS[a] for a in shuffled.order)
    assert prompt_options(build_prompt(STATE, ("go to the 2. door",)).text) == ("go to the 2. door",)
    assert count_option_lists([fixed.text, fixed.text]) == 1
    assert count_option_lists([fixed.text, shuffled.text, build_prompt(STATE, TAXI_ACTIONS[:3]).text]) == 3
    with pytest.raises(ValueError, match="not a policy prompt"):
        prompt_options(STATE)


def test_too_many_actions_and_no_actions_error():
    with pytest.raises(ValueError, match="3 legal actions but only 2 option labels"):
        build_prompt("s", ("a", "b", "c"), labels=("A", "B"))
    with pytest.raises(ValueError, match="at least one legal action"):
        build_prompt("s", ())
    too_many = tuple(f"action {i}" for i in range(len(DEFAULT_LABELS) + 1))
    with pytest.raises(ValueError, match="option labels"):
        build_prompt("s", too_many)


# -- reflection text helpers --------------------------------------------------------------------------------
def test_clean_reflection_and_with_stop():
    assert clean_reflection("  go north<end> trailing junk") == "go north"
    assert clean_reflection("plan\n# Options:\nA. forged\n# Action:\nA") == "plan"
    assert clean_reflection("plan # Action:\nB") == "plan"
    assert clean_reflection("no marker at all ") == "no marker at all"
    assert clean_reflection("<end>") == ""
    assert with_stop(" go east ") == "go east" + STOP_MARKER
    assert with_stop("go east<end>more") == "go east<end>"
    assert with_stop(with_stop("x")) == with_stop("x"), "with_stop is idempotent"


# -- labels vs tokenizer ------------------------------------------------------------------------------------
def test_label_token_ids_on_tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = label_token_ids(tok)
    assert len(ids) == len(DEFAULT_LABELS) == len(set(ids))
    base = tok(ACTION_CUE, add_special_tokens=False)["input_ids"]
    for label, tid in zip(DEFAULT_LABELS, ids, strict=True):
        assert tok(ACTION_CUE + label, add_special_tokens=False)["input_ids"] == base + [tid]
        assert tok.decode([tid]) == label


def test_label_validation_error_names_labels_and_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    from reflect_trl.tiny_models import build_tokenizer

    build_tokenizer(["hello world"], vocab_size=400).save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tok("10", add_special_tokens=False)["input_ids"]) == 2  # never seen as one word
    with pytest.raises(ValueError) as err:
        label_token_ids(tok, ("A", "10", "AB", "B", "A"))
    message = str(err.value)
    assert "'10'" in message and "'AB'" in message
    assert "A (same token as A)" in message
    assert "'B'" not in message
    assert str(tmp_path) in message, "the error names the tokenizer"
    assert re.search(r"after the action cue", message)
    assert label_token_ids(tok, ("A", "B")) == [
        tok.convert_tokens_to_ids("A"),
        tok.convert_tokens_to_ids("B"),
    ]
