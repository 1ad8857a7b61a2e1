"""The paper behind the Reflect-RL trainers: TRL writes it into every model card (``Trainer._paper``)."""

from __future__ import annotations

import textwrap

#: ``_paper`` of ``ReflectSFTTrainer`` and ``ReflectPPOTrainer`` (title, arXiv id, BibTeX citation).
REFLECT_RL_PAPER: dict[str, str] = {
    "title": "Reflect-RL: Two-Player Online RL Fine-Tuning for LMs",
    "id": "2402.12621",
    "citation": textwrap.dedent(
        """\
        @inproceedings{zhou2024reflectrl,
            title        = {{Reflect-RL: Two-Player Online RL Fine-Tuning for LMs}},
            author       = {Runlong Zhou and Simon S. Du and Beibin Li},
            year         = 2024,
            booktitle    = {Proceedings of the 62nd Annual Meeting of the Association for Computational Linguistics (ACL)},
            eprint       = {arXiv:2402.12621},
        }"""
    ),
}

__all__ = ["REFLECT_RL_PAPER"]
