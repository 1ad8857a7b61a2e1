"""The README's results tables are rendered from committed summaries (``reflect-trl readme``): a README that differs
from its ``docs/results/*/summary.json`` fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from reflect_trl.cli import main
from reflect_trl.pipelines.readme_tables import (
    BLOCK,
    load_summary,
    render_block,
    render_comparisons,
    render_naming,
    render_readme,
    render_table,
    stale_blocks,
)

REPO = Path(__file__).resolve().parents[1]


def _summary() -> dict:
    def row(conf, stage, decoding, rate, unseen_rate):
        return {
            "configuration": conf,
            "stage": stage,
            "decoding": decoding,
            "success_rate": rate,
            "ci_low": rate - 0.05,
            "ci_high": rate + 0.05,
            "seen_share": 0.3 if stage == "pickup" else 1.0,
            "seen": {"episodes": 3},
            "unseen": (
                {"success_rate": unseen_rate, "ci_low": unseen_rate - 0.1, "ci_high": unseen_rate + 0.1}
                if unseen_rate is not None
                else {"success_rate": None}
            ),
        }

    comparison = {
        "a": "Reflect SFT (before RL)",
        "b": "SFT only",
        "stage": "pickup",
        "decoding": "greedy",
        "decoding_b": "greedy",
        "diff": 0.377,
        "ci_low": 0.30,
        "ci_high": 0.45,
        "t_low": 0.28,
        "t_high": 0.475,
        "per_seed_diff": [0.3, 0.4],
        "seeds_agree": True,
        "unseen": {
            "diff": 0.2,
            "ci_low": -0.01,
            "ci_high": 0.4,
            "t_low": -0.1,
            "t_high": 0.5,
            "seeds_agree": False,
        },
    }
    return {
        "env_name": "taxi",
        "protocol": "strict",
        "seeds": [0, 1],
        "command": "reflect-trl reproduce --seeds 0 1 --output_dir outputs/reproduce/x",
        "rows": [
            row("SFT only", "pickup", "greedy", 0.149, 0.12),
            row("SFT only", "dropoff", "greedy", 0.035, None),
            row("Reflect SFT (before RL)", "pickup", "greedy", 0.525, 0.5),
            row("Reflect SFT (before RL)", "dropoff", "greedy", 0.786, None),
        ],
        "comparisons": [comparison, {**comparison, "stage": "dropoff", "unseen": None}],
    }


def test_table_shows_all_and_unseen_and_the_seen_share():
    table = render_table(_summary())
    assert "| configuration | decoding | pickup | pickup (unseen) | dropoff | dropoff (unseen) |" in table
    assert (
        "| Reflect SFT (before RL) | greedy | 52.5 % [47.5, 57.5] | 50.0 % [40.0, 60.0] | 78.6 % [73.6, 83.6] | – |"
        in table
    )
    assert "| *`test` episodes on trained instances* | | 30.0 % | | 100.0 % | |" in table


def test_comparisons_give_both_intervals_and_the_unseen_difference():
    text = render_comparisons(_summary())
    assert (
        "| Reflect SFT (before RL) − SFT only | greedy | all `test` | +37.7 [+30.0, +45.0; t [+28.0, +47.5]] |"
        in text
    )
    assert (
        "| Reflect SFT (before RL) − SFT only | greedy | unseen | +20.0 [-1.0, +40.0; t [-10.0, +50.0]], seeds disagree | – |"
        in text
    )


def test_naming_rates_give_both_rates_and_the_difference_with_its_t_interval():
    summary = _summary()
    summary["reflection_naming"] = [
        {
            "a": "Reflect-RL, both learn (verified reward)",
            "b": "Reflect SFT (before RL)",
            "stage": stage,
            "decoding": decoding,
            "rate_a": 0.8,
            "rate_b": 0.67,
            "diff": 0.13,
            "t_low": 0.05,
            "t_high": 0.21,
        }
        for stage in ("pickup", "full")
        for decoding in ("greedy", "sampled")
    ]
    text = render_naming(summary)
    assert text.splitlines()[0] == "| a − b | pickup | full |"
    assert (
        "| Reflect-RL, both learn (verified reward) − Reflect SFT (before RL) | 80.0 − 67.0 = +13.0 [t +5.0, +21.0] "
        "| 80.0 − 67.0 = +13.0 [t +5.0, +21.0] |" in text
    )
    assert len(text.splitlines()) == 3, "one line per pair, greedy only"


def test_a_changed_readme_number_is_stale_and_rendering_restores_it(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "summary.json").write_text(json.dumps(_summary()))
    skeleton = "# x\n<!-- results: docs/summary.json table -->\nold\n<!-- /results -->\ntext after\n"
    rendered = render_readme(skeleton, tmp_path)
    assert "52.5 % [47.5, 57.5]" in rendered and rendered.endswith("<!-- /results -->\ntext after\n")
    assert "`reflect-trl reproduce --seeds 0 1 --output_dir outputs/reproduce/x`" in rendered
    assert stale_blocks(rendered, tmp_path) == []
    drifted = rendered.replace("52.5 %", "53.5 %")
    assert stale_blocks(drifted, tmp_path) == ["docs/summary.json table"]
    readme = tmp_path / "README.md"
    readme.write_text(drifted)
    assert main(["readme", "--readme", str(readme), "--check"]) == 1
    assert main(["readme", "--readme", str(readme)]) == 0
    assert readme.read_text() == rendered
    assert main(["readme", "--readme", str(readme), "--check"]) == 0


def _two_decodings() -> dict:
    summary = _summary()
    summary["rows"] += [dict(r, decoding="sampled", success_rate=0.1) for r in summary["rows"]]
    reward = {**summary["comparisons"][0], "a": "Reflect-RL, both learn (verified reward)"}
    summary["comparisons"] += [
        {**c, "decoding": "sampled", "decoding_b": "sampled"} for c in summary["comparisons"]
    ] + [reward]
    return summary


def test_a_block_can_show_one_decoding_and_one_set_of_pairs():
    summary = _two_decodings()
    assert "| SFT only | sampled |" in render_table(summary)
    greedy = render_block(summary, "table", "s.json", {"decoding": "greedy"})
    assert "| SFT only | greedy |" in greedy and "| sampled |" not in greedy
    method = render_block(summary, "comparisons", "s.json", {"decoding": "sampled", "pairs": "method"})
    assert "| Reflect SFT (before RL) − SFT only | sampled | all `test` |" in method
    assert "greedy" not in method and "verified reward" not in method
    reward = render_block(summary, "comparisons", "s.json", {"pairs": "reflection_reward"})
    assert "| Reflect-RL, both learn (verified reward) − SFT only |" not in reward  # not a pair of the set
    assert len(reward.splitlines()) == 2 + 2  # header, rule, the note's two lines
    summary["comparisons"][-1]["b"] = "Reflect SFT (before RL)"
    reward = render_block(summary, "comparisons", "s.json", {"pairs": "reflection_reward"})
    assert (
        "| Reflect-RL, both learn (verified reward) − Reflect SFT (before RL) | greedy | all `test` |"
        in reward
    )


def test_a_comparison_against_a_reference_row_names_its_one_decoding():
    """`pairs=environment`: Reflect SFT greedy against the random policy's sampled row is shown, marked as such;
    a pair of two decodings that is no reference (versus_best) stays out."""
    summary = _summary()
    base = summary["comparisons"][0]
    summary["comparisons"] += [
        {**base, "b": "random policy", "decoding_b": "sampled"},
        {**base, "a": "Reflect-RL", "b": "Reflect SFT (before RL)", "decoding_b": "sampled"},
    ]
    summary["rows"] += [
        {**summary["rows"][0], "configuration": "random policy", "decoding": "sampled", "success_rate": 0.2}
    ]
    greedy = render_block(summary, "table", "s.json", {"decoding": "greedy"})
    assert "| random policy | sampled | 20.0 %" in greedy and "| SFT only | greedy |" in greedy
    text = render_block(summary, "comparisons", "s.json", {"pairs": "environment"})
    assert "| Reflect SFT (before RL) − random policy | greedy (b: sampled) | all `test` | +37.7" in text
    assert "| Reflect SFT (before RL) − SFT only | greedy | all `test` |" in text
    assert "Reflect-RL − Reflect SFT" not in text


def test_block_options_are_checked_and_kept_when_rendering(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps(_two_decodings()))
    skeleton = "<!-- results: s.json comparisons decoding=sampled pairs=method -->\n<!-- /results -->\n"
    rendered = render_readme(skeleton, tmp_path)
    assert rendered.startswith(
        "<!-- results: s.json comparisons decoding=sampled pairs=method -->\n| a − b |"
    )
    assert "| sampled |" in rendered and "| greedy |" not in rendered
    assert stale_blocks(rendered, tmp_path) == []
    assert stale_blocks(rendered.replace("+37.7", "+38.7"), tmp_path) == [
        "s.json comparisons decoding=sampled pairs=method"
    ]
    with pytest.raises(ValueError, match=r"'s.json table': unknown option\(s\) \['pairs'\]"):
        render_readme(skeleton.replace("comparisons", "table"), tmp_path)
    with pytest.raises(
        ValueError,
        match=r"pairs='others'; choose one of \['all', 'headline', 'method', 'reflection_reward', 'environment'\]",
    ):
        render_readme(skeleton.replace("pairs=method", "pairs=others"), tmp_path)
    with pytest.raises(
        ValueError, match=r"s.json: decoding='beam' is not in the summary \(it has \['greedy', 'sampled'\]\)"
    ):
        render_readme(skeleton.replace("decoding=sampled", "decoding=beam"), tmp_path)


def test_a_missing_or_incomplete_summary_is_named(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- results: docs/none.json table -->\n<!-- /results -->\n")
    assert main(["readme", "--readme", str(readme)]) == 1
    assert "docs/none.json" in capsys.readouterr().err
    (tmp_path / "half.json").write_text(json.dumps({"env_name": "taxi", "rows": []}))
    with pytest.raises(ValueError, match=r"half.json: a summary without protocol, seeds, comparisons"):
        load_summary(tmp_path / "half.json")


def test_the_readme_matches_its_committed_summaries():
    """Every results table of the README is rendered from a committed summary; each names the command (with its
    own --output_dir) that regenerates it."""
    text = (REPO / "README.md").read_text()
    blocks = list(BLOCK.finditer(text))
    assert blocks, "the README has no results block"
    assert stale_blocks(text, REPO) == [], "README results differ from docs/results: run `make readme`"
    outputs = {}
    for block in blocks:
        assert block["path"].startswith("docs/results/")
        summary = load_summary(REPO / block["path"])
        assert {"env_name", "protocol", "seeds", "rows", "comparisons"} <= set(summary)
        for c in summary["comparisons"]:
            assert {
                "a",
                "b",
                "stage",
                "decoding",
                "diff",
                "ci_low",
                "ci_high",
                "per_seed_diff",
                "unseen",
            } <= set(c)
        [out] = re.findall(r"--output_dir (\S+)", summary["command"])
        outputs.setdefault(out, set()).add(block["path"])
    assert all(len(paths) == 1 for paths in outputs.values()), f"summaries share an output folder: {outputs}"


def test_the_results_page_holds_every_row_of_the_readme_summaries_and_matches_them():
    """docs/results/README.md renders the full tables of every summary the README shows in part."""
    page = REPO / "docs" / "results" / "README.md"
    text = page.read_text()
    assert stale_blocks(text, page.parent) == [], (
        "docs/results/README.md differs from its summaries: run `make readme`"
    )
    full_tables = {m["path"] for m in BLOCK.finditer(text) if m["kind"] == "table" and not m["options"]}
    readme_summaries = {m["path"] for m in BLOCK.finditer((REPO / "README.md").read_text())}
    assert {f"docs/results/{p}" for p in full_tables} >= readme_summaries


def test_a_table_can_show_some_configurations_by_their_reproduce_names(tmp_path):
    summary = _two_decodings()
    text = render_block(summary, "table", "s.json", {"configurations": "reflect_sft", "decoding": "greedy"})
    assert "| Reflect SFT (before RL) | greedy |" in text and "SFT only" not in text
    (tmp_path / "s.json").write_text(json.dumps(summary))
    with pytest.raises(
        ValueError, match=r"'s.json table': configurations \['reflect_sfx'\] unknown; choose from"
    ):
        render_readme(
            "<!-- results: s.json table configurations=sft_only,reflect_sfx -->\n<!-- /results -->\n",
            tmp_path,
        )


def test_make_readme_renders_the_readme_and_the_results_page(tmp_path, monkeypatch, capsys):
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "s.json").write_text(json.dumps(_summary()))
    (tmp_path / "README.md").write_text("<!-- results: docs/results/s.json table -->\n<!-- /results -->\n")
    (tmp_path / "docs" / "results" / "README.md").write_text(
        "<!-- results: s.json comparisons -->\n<!-- /results -->\n"
    )
    monkeypatch.chdir(tmp_path)
    assert main(["readme", "--check"]) == 1
    assert main(["readme"]) == 0
    out = capsys.readouterr().out
    assert (
        "README.md: 1 block(s) re-rendered" in out and "docs/results/README.md: 1 block(s) re-rendered" in out
    )
    assert "52.5 %" in (tmp_path / "README.md").read_text()
    assert "+37.7" in (tmp_path / "docs" / "results" / "README.md").read_text()
    assert main(["readme", "--check"]) == 0
