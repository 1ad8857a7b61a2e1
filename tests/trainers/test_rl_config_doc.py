"""ReflectPPOConfig's docstring lists its fields in titled groups, as GRPOConfig's does."""

from __future__ import annotations

import dataclasses

from trl import GRPOConfig

from reflect_trl.trainers.rl_config import FIELD_GROUPS, ReflectPPOConfig


def test_every_own_field_is_documented_in_one_titled_group():
    inherited = {f.name for f in dataclasses.fields(GRPOConfig)}
    own = {f.name for f in dataclasses.fields(ReflectPPOConfig) if f.name not in inherited}
    grouped = [name for _, names in FIELD_GROUPS for name in names]
    assert len(grouped) == len(set(grouped)), "a field in two groups"
    assert own - set(grouped) == set(), "a field of ReflectPPOConfig missing from FIELD_GROUPS"
    doc = ReflectPPOConfig.__doc__
    assert "> Parameters that control the reflection player as a learner (beyond the paper)" in doc
    assert "reflection_reward (`str`, defaults to `'advantage'`):" in doc
    assert "the policy's turn advantage; verified: a reward of its own" in " ".join(doc.split())
