"""The one prompt builder (single-prompt action enumeration) used by data generation, SFT, RL and evaluation.

Layout of a policy prompt (``reflection`` optional)::

    <state text>
    # Reflection:
    <reflection text><STOP_MARKER>
    # Options:
    A. move south
    B. move north
    # Action:
    <label>                 <- the policy's one-token answer (the completion)

The reflection model's prompt is the prefix up to and including ``"# Reflection:\\n"``, so the policy prompt
of a reflecting agent is *reflection prompt + reflection + options block*: the rollout can reuse the
reflection's prompt tokens, and SFT/RL/eval all see byte-identical text.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Generation of a reflection stops on this marker (it is also the end of every reflection target).
STOP_MARKER = "<end>"
REFLECTION_HEADER = "# Reflection:\n"
OPTIONS_HEADER = "# Options:\n"
ACTION_CUE = "# Action:\n"

#: Default option labels: single characters, single tokens in byte-level BPE and SentencePiece vocabularies.
DEFAULT_LABELS: tuple[str, ...] = tuple(string.ascii_uppercase + string.ascii_lowercase + string.digits)


#: Written next to a trained policy (and next to generated data): the option labels it was trained with, so that
#: data, SFT, RL, evaluation and the demo all read one setting.
LABELS_FILE = "reflect_trl_labels.json"


def parse_option_labels(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """Option labels from a config value: a JSON/YAML list (``["1", "2"]``), a comma-separated string
    (``"1,2,3"``), or a string of single-character labels (``"ABCDEF"``). None/empty -> None (the default labels)."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as err:
                raise ValueError(f"option_labels {value!r} is not a valid JSON list ({err.msg})") from None
        elif "," in text:
            value = [part.strip() for part in text.split(",")]
        else:
            value = list(text)
    labels = tuple(str(v) for v in value)
    if not labels or any(not label or label != label.strip() for label in labels):
        raise ValueError(f"option_labels {value!r}: every label must be a non-empty string without spaces")
    if len(set(labels)) != len(labels):
        raise ValueError(f"option_labels {value!r}: labels must be distinct")
    return labels


def write_option_labels(directory: str | Path, labels: Sequence[str]) -> Path:
    """Record the option labels a model (or a data set) was made with in ``directory/LABELS_FILE``."""
    path = Path(directory) / LABELS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"option_labels": list(labels)}) + "\n")
    return path


def read_option_labels(directory: str | Path | None) -> tuple[str, ...] | None:
    """The labels recorded in ``directory`` (a local model or data directory), or None when none are recorded."""
    if directory is None:
        return None
    path = Path(directory) / LABELS_FILE
    if not path.is_file():
        return None
    try:
        return parse_option_labels(json.loads(path.read_text())["option_labels"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path}: cannot read the recorded option labels ({err})") from None


def resolve_option_labels(
    configured: str | Sequence[str] | None, recorded_in: str | Path | None = None, what: str = "the policy"
) -> tuple[str, ...]:
    """The labels to use: the configured ones, else those recorded with ``recorded_in``, else the defaults.

    A configured value that disagrees with the recorded one is an error (the model would be asked for tokens it
    was never trained to emit)."""
    labels = parse_option_labels(configured)
    recorded = read_option_labels(recorded_in) if recorded_in is not None else None
    if labels is not None and recorded is not None and labels != recorded:
        raise ValueError(
            f"option_labels {''.join(labels) if all(len(x) == 1 for x in labels) else list(labels)!r} differ from "
            f"the labels {list(recorded)!r} that {what} was trained with ({Path(recorded_in) / LABELS_FILE}); "
            "drop the option_labels setting or retrain"
        )
    return labels or recorded or DEFAULT_LABELS


@dataclass(frozen=True)
class PolicyPrompt:
    """A rendered policy prompt. ``order[i]`` is the environment action index shown under ``labels[i]``."""

    text: str
    labels: tuple[str, ...]
    order: tuple[int, ...]

    @property
    def num_options(self) -> int:
        return len(self.order)

    def action_index(self, option: int) -> int:
        """Map an option position (0 = first label) back to the environment's action index."""
        return self.order[option]

    def option_of(self, action_index: int) -> int:
        """Map an environment action index to its option position in this prompt."""
        return self.order.index(action_index)


def reflection_prompt(state_text: str) -> str:
    """The reflection model's prompt for a state."""
    return f"{state_text.rstrip()}\n{REFLECTION_HEADER}"


def clean_reflection(text: str) -> str:
    """Cut generated text at the stop marker (and never let it forge an options block)."""
    text = text.split(STOP_MARKER, 1)[0]
    for header in (OPTIONS_HEADER.strip(), ACTION_CUE.strip()):
        text = text.split(header, 1)[0]
    return text.strip()


def with_stop(reflection: str) -> str:
    """A reflection target as the reflection model must learn to write it: text + stop marker."""
    return f"{clean_reflection(reflection)}{STOP_MARKER}"


def option_order(num_actions: int, shuffle_seed: int | None) -> tuple[int, ...]:
    """Identity order, or a seeded permutation of the options."""
    order = list(range(num_actions))
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(order)
    return tuple(order)


def options_block(actions: Sequence[str], labels: Sequence[str], order: Sequence[int]) -> str:
    lines = [f"{labels[i]}. {actions[a]}" for i, a in enumerate(order)]
    return OPTIONS_HEADER + "\n".join(lines) + "\n" + ACTION_CUE


def prompt_options(prompt: str) -> tuple[str, ...]:
    """The options' texts of a policy prompt, in the order shown (labels removed): the inverse of
    :func:`options_block`."""
    _, header, rest = prompt.rpartition(OPTIONS_HEADER)
    block, cue, _ = rest.partition(ACTION_CUE)
    if not header or not cue:
        raise ValueError(
            f"not a policy prompt: no {OPTIONS_HEADER.strip()!r} ... {ACTION_CUE.strip()!r} block"
        )
    return tuple(line.split(". ", 1)[1] if ". " in line else line for line in block.strip("\n").split("\n"))


def count_option_lists(prompts: Iterable[str]) -> int:
    """How many different option lists (texts and order) ``prompts`` show: 1 when every move keeps its label."""
    return len({prompt_options(prompt) for prompt in prompts})


def build_prompt(
    state_text: str,
    actions: Sequence[str],
    reflection: str | None = None,
    *,
    labels: Sequence[str] = DEFAULT_LABELS,
    shuffle_seed: int | None = None,
) -> PolicyPrompt:
    """Render the policy prompt for a state, its legal actions and (optionally) a reflection.

    ``reflection=None`` gives the plain prompt (no reflection section) of the "without reflection" variants;
    a reflection string (possibly empty) gives the Reflect-RL prompt. ``shuffle_seed`` shuffles the option
    order deterministically.
    """
    if not actions:
        raise ValueError("build_prompt needs at least one legal action")
    if len(actions) > len(labels):
        raise ValueError(f"{len(actions)} legal actions but only {len(labels)} option labels are configured")
    order = option_order(len(actions), shuffle_seed)
    if reflection is None:
        head = state_text.rstrip() + "\n"
    else:
        head = reflection_prompt(state_text) + with_stop(reflection) + "\n"
    shown = tuple(labels[: len(actions)])
    return PolicyPrompt(text=head + options_block(actions, shown, order), labels=shown, order=order)


def encode_prompts(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Prompt token ids exactly as TRL's ``SFTTrainer`` tokenizes a prompt (``tokenizer(text=...)``, special tokens
    included, e.g. the BOS of Llama/Mistral tokenizers), so SFT, rollouts and evaluation feed the same ids."""
    return tokenizer(list(texts))["input_ids"] if texts else []


def encode_truncated_prompts(tokenizer, prompts: Sequence[str], max_length: int | None) -> list[list[int]]:
    """:func:`encode_prompts`, keeping the last ``max_length`` ids of a longer prompt (``None``/0: no limit)."""
    ids = encode_prompts(tokenizer, prompts)
    if max_length:
        ids = [x[-max_length:] for x in ids]
    return ids


def label_token_ids(tokenizer, labels: Sequence[str] = DEFAULT_LABELS, cue: str = ACTION_CUE) -> list[int]:
    """Token id of each label *as it is used* (right after the action cue).

    Raises ``ValueError`` naming every label that is not exactly one token there (or that collides with
    another label), and the tokenizer.
    """
    base = tokenizer(cue, add_special_tokens=False)["input_ids"]
    ids: list[int] = []
    bad: list[str] = []
    for label in labels:
        full = tokenizer(cue + label, add_special_tokens=False)["input_ids"]
        if len(full) != len(base) + 1 or full[: len(base)] != base:
            bad.append(label)
            ids.append(-1)
        else:
            ids.append(full[-1])
    seen: dict[int, str] = {}
    for label, tid in zip(labels, ids, strict=True):
        if tid < 0:
            continue
        if tid in seen:
            bad.append(f"{label} (same token as {seen[tid]})")
        seen[tid] = label
    if bad:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(
            f"option labels {bad} are not single, distinct tokens of tokenizer {name!r} "
            f"({type(tokenizer).__name__}) after the action cue {cue!r}; choose other labels "
            "(e.g. `option_labels: ABCDEFGH`) or a tokenizer that has them"
        )
    return ids


def recommended_action(reflection: str | None, actions: Sequence[str]) -> int | None:
    """Index of the action whose text occurs last in ``reflection`` (the one it recommends), or None."""
    best, position = None, -1
    for index, text in enumerate(actions):
        found = (reflection or "").rfind(text)
        if found > position:
            best, position = index, found
    return best
