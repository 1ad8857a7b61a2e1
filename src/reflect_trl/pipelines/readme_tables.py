"""README results tables rendered from committed summaries, so that a README number cannot drift from its run.

A results block of ``README.md`` is the text between a marker and its end marker::

    <!-- results: docs/results/taxi-strict/summary.json table -->
    ... rendered ...
    <!-- /results -->

The kind after the path is ``table`` (configurations x stages: success on all `test` episodes and on unseen
instances), ``comparisons`` (the headline differences a - b with both intervals, per seed and on unseen instances) or
``naming`` (the closed-loop rates at which the reflections name an optimal move, a - b with a t interval over seeds).
Options may follow the kind: ``decoding=greedy`` (one decoding only); for a table, ``configurations=sft_only,reflect_rl``
(those rows only, by their ``reproduce`` names); for comparisons, ``pairs=headline`` (one set of
:data:`COMPARISON_SETS`).
``reflect-trl readme`` re-renders every block from its ``summary.json`` (the schema ``reflect-trl reproduce``
writes); ``--check`` only compares and exits 1 when the README disagrees with a summary (the test suite runs it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reflect_trl.pipelines.protocols import CONFIGURATIONS

BLOCK = re.compile(
    r"(?P<open><!-- results: (?P<path>\S+) (?P<kind>table|comparisons|naming)(?P<options>(?: [a-z]+=\S+)*) -->\n)"
    r"(?P<body>.*?)(?P<close><!-- /results -->)",
    re.S,
)

#: The comparisons of the method and its ablations a README states, in this order (a, b).
METHOD_COMPARISONS: tuple[tuple[str, str], ...] = (
    ("Reflect SFT (before RL)", "SFT only"),
    ("Reflect-RL", "SFT + RL w/o reflection"),
    ("Reflect-RL", "Reflect SFT (before RL)"),
    ("Reflect-RL", "Reflect-RL w/o negative examples"),
    ("Reflect-RL", "Reflect-RL w/o curriculum"),
    ("Reflect-RL, reflections sampled in RL", "Reflect SFT (before RL)"),
    ("Reflect-RL, both players learn", "Reflect SFT (before RL)"),
    ("Reflect-RL, only the reflection learns", "Reflect-RL, reflections sampled in RL"),
    ("Reflect SFT (before RL)", "oracle + random (the data's behaviour, no training)"),
    ("Reflect-RL", "follows its reflection (no policy training)"),
)

#: The reflection's own reward against Reflect SFT, the advantage-trained reflection and the two controls
#: (docs/results/taxi-reflection-reward).
REFLECTION_REWARD_COMPARISONS: tuple[tuple[str, str], ...] = (
    ("Reflect-RL, both learn (verified reward)", "Reflect SFT (before RL)"),
    ("Reflect-RL, both learn (mixed reward)", "Reflect SFT (before RL)"),
    ("Reflect-RL, only the reflection learns (verified reward)", "Reflect SFT (before RL)"),
    ("Reflect-RL, both learn (verified reward)", "Reflect-RL, both players learn"),
    (
        "Reflect-RL, only the reflection learns (verified reward)",
        "Reflection: on-policy oracle SFT (control)",
    ),
    (
        "Reflect-RL, only the reflection learns (verified reward)",
        "Reflection: SFT continued, label-matched (control)",
    ),
)

#: The comparisons a results page states, in this order; each under every decoding of the summary that has it.
HEADLINE_COMPARISONS = METHOD_COMPARISONS + REFLECTION_REWARD_COMPARISONS
#: The sets a block can name with ``pairs=<name>``: ``headline`` is what the README's short table states (does
#: reflection carry the method, does RL add to its SFT start, with a frozen or a learning reflection player).
COMPARISON_SETS = {
    "all": HEADLINE_COMPARISONS,
    "headline": (
        ("Reflect SFT (before RL)", "SFT only"),
        ("Reflect-RL", "SFT + RL w/o reflection"),
        ("Reflect-RL", "Reflect SFT (before RL)"),
        ("Reflect-RL, both players learn", "Reflect SFT (before RL)"),
    ),
    "method": METHOD_COMPARISONS,
    "reflection_reward": REFLECTION_REWARD_COMPARISONS,
    # an environment beyond DangerousTaxi: does reflection help, does the pair beat random play, does RL add
    "environment": (
        ("Reflect SFT (before RL)", "SFT only"),
        ("Reflect SFT (before RL)", "random policy"),
        ("Reflect-RL", "Reflect SFT (before RL)"),
    ),
}


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def _pts(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:+.1f}"


def _stages(summary: Mapping[str, Any]) -> list[str]:
    return list(dict.fromkeys(r["stage"] for r in summary["rows"]))


def _one_decoding_rows() -> set[str]:
    """The labels of the scripted configurations with one decoding (``ScriptedActor.decoding``: the oracle greedy, the
    random policy sampled); a table restricted to another decoding keeps them, and a comparison against one pairs
    every decoding of ``a`` with it (reproduce's ``versus_reference``)."""
    from reflect_trl.pipelines.protocols import CONFIGURATIONS
    from reflect_trl.scripted_actors import scripted_class

    scripted = {c.label: scripted_class(c.policy) for c in CONFIGURATIONS.values()}
    return {label for label, actor in scripted.items() if actor is not None and actor.decoding}


def _rate_cell(rate: float | None, low: float | None, high: float | None) -> str:
    if rate is None:
        return "–"
    if low is None or high is None:
        return f"{_pct(rate)} %"
    return f"{_pct(rate)} % [{_pct(low)}, {_pct(high)}]"


def render_table(
    summary: Mapping[str, Any], decoding: str | None = None, configurations: Sequence[str] | None = None
) -> str:
    """Configurations x stages: the success rate [95 % bootstrap interval] on all `test` episodes and on the unseen
    instances, one line per (configuration, decoding) (``decoding``: that one only, and the one decoding of a
    row with one decoding; ``configurations``: those labels only), then the share of episodes on trained
    instances."""
    stages = _stages(summary)
    rows = {(r["configuration"], r["decoding"], r["stage"]): r for r in summary["rows"]}
    reference = _one_decoding_rows()
    order = list(
        dict.fromkeys(
            (r["decoding"], r["configuration"])
            for r in summary["rows"]
            if (decoding in (None, r["decoding"]) or r["configuration"] in reference)
            and (configurations is None or r["configuration"] in configurations)
        )
    )
    header = ["configuration", "decoding"] + [f"{s}{part}" for s in stages for part in ("", " (unseen)")]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (2 * len(stages))]
    for decoding, configuration in order:
        cells = [configuration, decoding]
        for stage in stages:
            r = rows.get((configuration, decoding, stage))
            if r is None:
                cells += ["", ""]
                continue
            unseen = r.get("unseen") or {}
            cells.append(_rate_cell(r["success_rate"], r["ci_low"], r["ci_high"]))
            cells.append(_rate_cell(unseen.get("success_rate"), unseen.get("ci_low"), unseen.get("ci_high")))
        lines.append("| " + " | ".join(cells) + " |")
    line = "| *`test` episodes on trained instances* | |"
    for stage in stages:
        share = next((r.get("seen_share") for r in summary["rows"] if r["stage"] == stage), None)
        line += f" {_pct(share)} % | |" if share is not None else " – | |"
    lines.append(line)
    return "\n".join(lines) + "\n"


def _difference(c: Mapping[str, Any] | None) -> str:
    if c is None:
        return "–"
    t = f"; t [{_pts(c['t_low'])}, {_pts(c['t_high'])}]" if c.get("t_low") is not None else ""
    agree = "" if c.get("seeds_agree", True) else ", seeds disagree"
    return f"{_pts(c['diff'])} [{_pts(c['ci_low'])}, {_pts(c['ci_high'])}{t}]{agree}"


def render_comparisons(
    summary: Mapping[str, Any],
    pairs: Sequence[tuple[str, str]] = HEADLINE_COMPARISONS,
    decoding: str | None = None,
) -> str:
    """The headline differences a - b in points: the pooled difference [95 % bootstrap; 95 % t over seeds] on all
    `test` episodes, then on unseen instances ("–": the stage has none), per (pair, decoding) and stage
    (``decoding``: that one only)."""
    stages = _stages(summary)
    reference = _one_decoding_rows()
    same = [
        c
        for c in summary["comparisons"]
        if (c.get("decoding_b", c["decoding"]) == c["decoding"] or c["b"] in reference)
        and decoding in (None, c["decoding"])
    ]
    by = {(c["a"], c["b"], c["decoding"], c["stage"]): c for c in same}
    decodings = list(dict.fromkeys(c["decoding"] for c in same))
    lines = [
        "| a − b | decoding | episodes | " + " | ".join(stages) + " |",
        "|---|---|---|" + "---|" * len(stages),
    ]
    for a, b in pairs:
        for decoding in decodings:
            found = [by.get((a, b, decoding, stage)) for stage in stages]
            if not any(found):
                continue
            shown = decoding
            other = next((c.get("decoding_b", decoding) for c in found if c), decoding)
            if other != decoding:  # a reference row's one decoding
                shown = f"{decoding} (b: {other})"
            for part, label in (("all", "all `test`"), ("unseen", "unseen")):
                cells = [_difference(c if part == "all" else (c or {}).get("unseen")) for c in found]
                lines.append(f"| {a} − {b} | {shown} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_naming(summary: Mapping[str, Any], decoding: str = "greedy") -> str:
    """The closed-loop optimal-naming rates a and b and their difference a - b in points [95 % t interval over the
    per-seed differences], per pair and stage, for ``decoding``."""
    naming = [c for c in summary.get("reflection_naming") or [] if c["decoding"] == decoding]
    stages = list(dict.fromkeys(c["stage"] for c in naming))
    by = {(c["a"], c["b"], c["stage"]): c for c in naming}
    lines = ["| a − b | " + " | ".join(stages) + " |", "|---|" + "---|" * len(stages)]
    for a, b in dict.fromkeys((c["a"], c["b"]) for c in naming):
        cells = []
        for stage in stages:
            c = by.get((a, b, stage))
            cells.append(
                "–"
                if c is None
                else f"{_pct(c['rate_a'])} − {_pct(c['rate_b'])} = {_pts(c['diff'])} [t {_pts(c['t_low'])}, "
                f"{_pts(c['t_high'])}]"
            )
        lines.append(f"| {a} − {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


#: The options a block's marker may add after its kind (``<!-- results: PATH comparisons decoding=greedy -->``).
BLOCK_OPTIONS = {
    "table": ("decoding", "configurations"),
    "comparisons": ("decoding", "pairs"),
    "naming": ("decoding",),
}


def parse_block_options(path: str, kind: str, options: str) -> dict[str, str]:
    """The ``key=value`` options of a block's marker, checked against what ``kind`` accepts."""
    parsed = dict(item.split("=", 1) for item in options.split())
    unknown = sorted(set(parsed) - set(BLOCK_OPTIONS[kind]))
    if unknown:
        raise ValueError(
            f"results block '{path} {kind}': unknown option(s) {unknown}; a {kind} block takes {list(BLOCK_OPTIONS[kind])}"
        )
    if parsed.get("pairs", "all") not in COMPARISON_SETS:
        raise ValueError(
            f"results block '{path} {kind}': pairs={parsed['pairs']!r}; choose one of {list(COMPARISON_SETS)}"
        )
    if "configurations" in parsed:
        unknown = [c for c in parsed["configurations"].split(",") if c not in CONFIGURATIONS]
        if unknown:
            raise ValueError(
                f"results block '{path} {kind}': configurations {unknown} unknown; choose from {list(CONFIGURATIONS)}"
            )
    return parsed


def render_block(
    summary: Mapping[str, Any], kind: str, path: str, options: Mapping[str, str] | None = None
) -> str:
    """One README block: the table, the comparisons or the naming rates (restricted by the marker's ``options``), and
    the command that regenerates its summary."""
    options = dict(options or {})
    decodings = list(dict.fromkeys(r["decoding"] for r in summary["rows"]))
    if options.get("decoding", decodings[0] if decodings else None) not in decodings:
        raise ValueError(
            f"{path}: decoding={options['decoding']!r} is not in the summary (it has {decodings})"
        )
    if kind == "comparisons" and "pairs" in options:
        options["pairs"] = COMPARISON_SETS[options["pairs"]]
    if "configurations" in options:
        options["configurations"] = [CONFIGURATIONS[c].label for c in options["configurations"].split(",")]
    renderers = {"table": render_table, "comparisons": render_comparisons, "naming": render_naming}
    body = renderers[kind](summary, **options)
    seeds = ", ".join(map(str, summary["seeds"]))
    command = summary.get("command")
    note = f"\n<sub>Rendered by `make readme` from [`{path}`]({path}) (seeds {seeds}); " + (
        f"regenerate it with `{command}`, then copy its `summary.json` there.</sub>\n"
        if command
        else "</sub>\n"
    )
    return body + note


def load_summary(path: Path) -> dict[str, Any]:
    """A committed summary, with a clear error naming the file when it is missing or lacks a field."""
    try:
        summary = json.loads(path.read_text())
    except OSError as err:
        raise FileNotFoundError(
            f"{path}: cannot read the summary a README block names ({err.strerror})"
        ) from err
    except ValueError as err:
        raise ValueError(f"{path}: not JSON ({err})") from err
    missing = [k for k in ("env_name", "protocol", "seeds", "rows", "comparisons") if k not in summary]
    if missing:
        raise ValueError(
            f"{path}: a summary without {', '.join(missing)} (written by reflect-trl reproduce?)"
        )
    return summary


def render_readme(text: str, root: Path) -> str:
    """``text`` with every results block re-rendered from its summary (paths relative to ``root``)."""

    return BLOCK.sub(lambda match: match["open"] + _render_match(match, root) + match["close"], text)


def _render_match(match: re.Match, root: Path) -> str:
    options = parse_block_options(match["path"], match["kind"], match["options"])
    return render_block(load_summary(root / match["path"]), match["kind"], match["path"], options)


def stale_blocks(text: str, root: Path) -> list[str]:
    """The ``path kind [options]`` of every results block of ``text`` that differs from its rendering."""
    return [
        f"{m['path']} {m['kind']}{m['options']}"
        for m in BLOCK.finditer(text)
        if m["body"] != _render_match(m, root)
    ]
