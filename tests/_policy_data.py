"""Policy SFT rows of real DangerousTaxi prompts, for the tests of the SFT anchor."""

from __future__ import annotations

import json

from reflect_trl.envs import make_env
from reflect_trl.prompts import DEFAULT_LABELS, build_prompt


def write_policy_rows(path, n: int = 5, split: str = "train") -> list[dict]:
    """``n`` policy SFT rows of real DangerousTaxi prompts (targets cycle over the offered options)."""
    env = make_env("taxi")
    rows = []
    for i, task in enumerate(env.make_tasks("train", n, seed=3, difficulty="pickup")):
        obs = env.reset(task=task)
        label = DEFAULT_LABELS[i % len(obs.actions)]
        rows.append(
            {"split": split, "prompt": build_prompt(obs.text, obs.actions).text, "completion": f" {label}",
             "num_options": len(obs.actions)}
        )  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows
