"""List-valued settings: a YAML/JSON list and a comma-separated string mean the same.

``stages: [pickup, dropoff]`` in a recipe, ``--stages pickup,dropoff``, ``--stages '["pickup", "dropoff"]'`` and
``--stages pickup dropoff`` (argparse's ``nargs="+"``) all give ``["pickup", "dropoff"]``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def _split(text: str, what: str) -> list[str]:
    text = text.strip()
    if text.startswith("["):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{what}: {text!r} is not a valid JSON list ({err.msg}); write a list or a comma-separated string"
            ) from None
        if not isinstance(value, list):
            raise ValueError(f"{what}: {text!r} is not a list")
        return [str(v).strip() for v in value]
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_list(value: str | Sequence[Any] | None, what: str = "value") -> list[str] | None:
    """``value`` as a list of strings (None or an empty string -> None); ``what`` names the setting in errors."""
    if value is None:
        return None
    if isinstance(value, str):
        items = _split(value, what)
    elif isinstance(value, Sequence):
        items = [part for v in value for part in (_split(v, what) if isinstance(v, str) else [str(v)])]
    else:
        raise ValueError(f"{what}: expected a list or a comma-separated string, got {value!r}")
    return items or None


def parse_int_list(value: str | Sequence[Any] | None, what: str = "value") -> list[int] | None:
    """:func:`parse_list` of integers."""
    items = parse_list(value, what)
    if items is None:
        return None
    try:
        return [int(v) for v in items]
    except ValueError:
        raise ValueError(f"{what}: expected integers, got {items}") from None


__all__ = ["parse_int_list", "parse_list"]
