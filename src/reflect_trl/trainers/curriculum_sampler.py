"""Curriculum-ordered sampling for SFT: each epoch walks the stages easy to hard, shuffled within a stage."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from torch.utils.data import Sampler

from reflect_trl.seeding import derive_seed


class CurriculumOrderedSampler(Sampler[int]):
    """Yields the rows of each stage in turn (``stages`` easy to hard), shuffled within a stage with a seed
    that changes with :meth:`set_epoch`. Every epoch repeats the curriculum."""

    def __init__(self, difficulties: Sequence[str], stages: Sequence[str], seed: int = 0) -> None:
        unknown = sorted(set(difficulties) - set(stages))
        if unknown:
            raise ValueError(
                f"curriculum_order: difficulty value(s) {unknown} are not among the stages {list(stages)}; "
                "set `stages` to every difficulty in the data, easy to hard"
            )
        self.stages = list(stages)
        self.groups = [[i for i, d in enumerate(difficulties) if d == stage] for stage in self.stages]
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return sum(len(g) for g in self.groups)

    def __iter__(self) -> Iterator[int]:
        rng = random.Random(derive_seed(self.seed, "curriculum_order", self.epoch))
        for group in self.groups:
            order = list(group)
            rng.shuffle(order)
            yield from order


def stage_order(difficulties: Sequence[str], stages: Sequence[str] | None) -> list[str]:
    """``stages`` if given, else the difficulties in order of first appearance."""
    return list(stages) if stages else list(dict.fromkeys(difficulties))


__all__ = ["CurriculumOrderedSampler", "stage_order"]
