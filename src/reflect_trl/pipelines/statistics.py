"""The statistics of ``reflect-trl reproduce``: pooling several training seeds' held-out results, intervals that include
the seed-to-seed variance, paired comparisons of configurations (also at the other one's best decoding), and the
training instances of a seed (to split held-out episodes into seen / unseen).

Intervals (95 %):

* **bootstrap** (:func:`hierarchical_bootstrap`), percentile interval of the pooled mean. The seeds are resampled with
  replacement, and so are the problem instances (``TextEnv.instance_key``; one instance keeps all its episodes):
  *nested* (each drawn seed's own instances) when every seed has instances of its own, *crossed* (one draw of the
  instances, applied to every drawn seed: the pigeonhole bootstrap of a seed x instance design) when instance keys
  repeat across seeds, as DangerousTaxi's ``dropoff`` does (the same 12 start states under every seed): resampling them
  per seed would count one start state as independent evidence five times.
* **t over seeds** (:func:`t_interval`): mean of the per-seed values +- t_{0.975, S-1} s / sqrt(S). With few seeds a
  percentile bootstrap over them under-covers (it cannot be wider than the seeds' range); the t interval is the
  conservative companion, and a claim should hold under both.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from reflect_trl.seeding import derive_seed

#: t_{0.975, df} for df = 1..30 (two-sided 95 %); larger df use the normal quantile's Cornish-Fisher correction.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
    2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_quantile_975(df: int) -> float:
    """The 97.5 % quantile of Student's t with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError(f"t quantile: df must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def t_interval(values: Sequence[float | None]) -> tuple[float, float] | None:
    """95 % t interval of the mean of ``values`` (one per training seed; ``None`` entries are left out): mean +-
    t_{0.975, n-1} s / sqrt(n). ``None`` with fewer than two values."""
    xs = [float(v) for v in values if v is not None]
    if len(xs) < 2:
        return None
    mean = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    half = t_quantile_975(len(xs) - 1) * sd / math.sqrt(len(xs))
    return mean - half, mean + half


# ------------------------------------------------------------------------------------------------- statistics
def outcomes_by_exposure(
    cells: Sequence[Mapping[str, Any]], seen: Sequence[set[str] | None]
) -> dict[str, dict[str, Any]] | None:
    """The outcomes of one row's cells (one per seed) split by whether the episode's instance was also among that
    seed's training tasks (``seen[i]``: the training instance keys of cell i's seed and stage)."""
    if any(s is None or not c.get("instances") for c, s in zip(cells, seen, strict=True)):
        return None
    out = {}
    for part, wanted in (("seen", True), ("unseen", False)):
        successes = episodes = instances = 0
        for cell, keys in zip(cells, seen, strict=True):
            chosen = [
                (k, o)
                for k, o in zip(cell["instances"], cell["outcomes"], strict=True)
                if (k in keys) == wanted
            ]
            successes += sum(bool(o) for _, o in chosen)
            episodes += len(chosen)
            instances += len({k for k, _ in chosen})
        out[part] = {
            "successes": successes,
            "episodes": episodes,
            "instances": instances,
            "success_rate": successes / episodes if episodes else None,
        }
    return out


def exposure_of_results(results: list[dict[str, Any]], training: dict[str, set[str]]) -> list[dict[str, Any]]:
    """Per result: the share of its episodes whose problem instance an SFT or RL task of this run posed, and the
    success on the others (the splits hold out task seeds, not instances)."""
    out = []
    for r in results:
        split = outcomes_by_exposure([r], [training.get(r["stage"], set())])
        if split is None:
            continue
        out.append(
            {
                "configuration": r["configuration"],
                "stage": r["stage"],
                "decoding": r["decoding"],
                "seen_share": split["seen"]["episodes"] / r["episodes"] if r["episodes"] else None,
                "unseen": split["unseen"],
            }
        )
    return out


def pool_rows(
    per_seed: Mapping[int, Sequence[Mapping[str, Any]]],
    training: Mapping[int, Mapping[str, set[str]]] | None = None,
    resamples: int = 2_000,
) -> list[dict[str, Any]]:
    """Pool the evaluation results of several seeds: one row per (configuration, stage, decoding), with the pooled
    success rate's 95 % interval over seeds and instances (:func:`hierarchical_bootstrap`) and the pooled reflection
    diagnostics (counts summed over seeds).

    With ``training`` (seed -> stage -> instance keys of that seed's training tasks), each row also gets ``seen`` /
    ``unseen``: its held-out episodes whose problem instance was / was not among the training tasks (an environment
    with few instances, like DangerousTaxi, repeats training instances in its held-out split)."""
    seeds = sorted(per_seed)
    keys: dict[tuple[str, str, str], None] = {}
    for seed in seeds:
        for r in per_seed[seed]:
            keys[(r["configuration"], r["stage"], r["decoding"])] = None
    rows = []
    for configuration, stage, decoding in keys:
        cells = []
        for seed in seeds:
            match = [
                r
                for r in per_seed[seed]
                if (r["configuration"], r["stage"], r["decoding"]) == (configuration, stage, decoding)
            ]
            if len(match) != 1:
                raise ValueError(
                    f"seed {seed}: expected one result for {configuration!r} / {stage} / {decoding}, got {len(match)}"
                )
            cells.append(match[0])
        successes = sum(int(c["successes"]) for c in cells)
        episodes = sum(int(c["episodes"]) for c in cells)
        if not episodes:  # e.g. design D3: every held-out instance of the stage was a training task
            continue
        # distinct instances per seed (one instance under two seeds' models is two observations)
        instances = sum(len(set(c.get("instances") or [])) or int(c["episodes"]) for c in cells)
        rate = successes / episodes
        _, low, high = hierarchical_bootstrap(
            [list(c["outcomes"]) for c in cells],
            [_instance_keys(c, i) for i, c in enumerate(cells)],
            resamples,
            # seeded by the row itself: its interval does not depend on which other rows the summary has
            seed=derive_seed("row", configuration, stage, decoding),
        )
        rows.append(
            {
                "configuration": configuration,
                "stage": stage,
                "decoding": decoding,
                "successes": successes,
                "episodes": episodes,
                "instances": instances,
                "success_rate": rate,
                "ci_low": low,
                "ci_high": high,
                # None for a seed with no episode in the row (design D3: all its held-out instances were trained on)
                "per_seed": [c["success_rate"] if int(c["episodes"]) else None for c in cells],
                "per_seed_successes": [int(c["successes"]) for c in cells],
                "per_seed_episodes": [int(c["episodes"]) for c in cells],
                "diagnostics": _sum_counts([c.get("diagnostics") or {} for c in cells]),
            }
        )
        if training is not None:
            exposure = outcomes_by_exposure(cells, [training.get(seed, {}).get(stage) for seed in seeds])
            if exposure is not None:
                rows[-1].update(exposure)
    return rows


def _instance_keys(result: Mapping[str, Any], seed_index: int) -> list:
    """The instance key of every episode of one seed's result; without recorded instances every episode is its own
    instance (keys that cannot repeat across seeds)."""
    if result.get("instances"):
        return list(result["instances"])
    return [(seed_index, i) for i in range(len(result["outcomes"]))]


def _sum_counts(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts (nested dicts of counts too) added up."""
    total: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, Mapping):
                total[key] = _sum_counts([total.get(key, {}), value])
            else:
                total[key] = total.get(key, 0) + value
    return total


def training_instances(cfg: Any) -> dict[str, set[str]]:
    """Stage -> instance keys of the training tasks of a demo run (its SFT data and its RL tasks)."""
    from reflect_trl.envs import make_env
    from reflect_trl.pipelines.demo import rl_task_list

    env = make_env(cfg.env_name, **dict(cfg.env_kwargs))
    keys: dict[str, set[str]] = {}
    for stage in env.stages:
        sft = env.make_tasks("train", cfg.n_train_tasks, seed=cfg.seed, difficulty=stage)
        keys[stage] = {env.instance_key(t) for t in sft}
    for task in rl_task_list(cfg):
        keys.setdefault(task.difficulty, set()).add(env.instance_key(task))
    return keys


def _clusters(outcomes: Sequence[int], keys: Sequence[Any]) -> list[tuple[int, int]]:
    """(sum of outcomes, number of episodes) per distinct instance of one seed."""
    clusters: dict[Any, list[int]] = {}
    for key, x in zip(keys, outcomes, strict=True):
        cell = clusters.setdefault(key, [0, 0])
        cell[0] += x
        cell[1] += 1
    return [(a, n) for a, n in clusters.values()]


def hierarchical_bootstrap(
    values: Sequence[Sequence[int | float]],
    instances: Sequence[Sequence[Any]] | None = None,
    resamples: int = 10_000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Pooled mean of ``values[s][i]`` (episode i of training seed s) and its 95 % percentile interval from a
    bootstrap that includes the seed-to-seed variance (module docstring): each replicate draws the training seeds with
    replacement and the problem instances (``instances[s][i]``; None: every episode its own) with replacement, each
    with all its episodes, and recomputes the pooled mean. Instances are drawn within each drawn seed (nested) when no
    instance key occurs under two seeds, and once for all seeds (crossed) when keys repeat across seeds. Seeds without
    episodes are left out; with one seed it reduces to the bootstrap over instances."""
    if not values:
        raise ValueError("no seeds to pool")
    per_seed = []
    for s, vals in enumerate(values):
        keys = list(instances[s]) if instances is not None else list(range(len(vals)))
        if len(keys) != len(vals):
            raise ValueError(f"seed index {s}: {len(keys)} instance keys for {len(vals)} outcomes")
        if vals:
            per_seed.append(_cluster_map(vals, keys if instances is not None else [(s, i) for i in keys]))
    total = sum(n for c in per_seed for _, n in c.values())
    if total == 0:
        raise ValueError("no outcomes to pool")
    point = sum(a for c in per_seed for a, _ in c.values()) / total
    shared = len(per_seed) > 1 and sum(len(c) for c in per_seed) > len(set().union(*per_seed))
    if shared:
        replicates = _crossed_replicates(per_seed, resamples, seed)
    else:
        replicates = _nested_replicates([list(c.values()) for c in per_seed], resamples, seed)
    replicates.sort()
    return point, replicates[int(0.025 * (resamples - 1))], replicates[int(round(0.975 * (resamples - 1)))]


def _cluster_map(outcomes: Sequence[int | float], keys: Sequence[Any]) -> dict[Any, tuple[float, int]]:
    """Instance key -> (sum of outcomes, number of episodes) of one seed."""
    return {
        k: (float(a), n) for k, (a, n) in zip(dict.fromkeys(keys), _clusters(outcomes, keys), strict=True)
    }


def _nested_replicates(per_seed: list[list[tuple[float, int]]], resamples: int, seed: int) -> list[float]:
    """Seeds with replacement, then each drawn seed's own instances with replacement."""
    rng = random.Random(seed)
    replicates = []
    for _ in range(resamples):
        acc = size = 0
        for _ in range(len(per_seed)):
            clusters = per_seed[rng.randrange(len(per_seed))]
            for _ in range(len(clusters)):
                a, n = clusters[rng.randrange(len(clusters))]
                acc += a
                size += n
        replicates.append(acc / size if size else 0.0)
    return replicates


def _crossed_replicates(
    per_seed: list[dict[Any, tuple[float, int]]], resamples: int, seed: int, chunk: int = 1_000
) -> list[float]:
    """Seeds with replacement and, independently, the union of the instance keys with replacement: an instance
    drawn m times counts m times under every drawn seed that played it (sum of outcomes A[s, k], episodes N[s, k])."""
    keys = list(dict.fromkeys(k for c in per_seed for k in c))
    column = {k: j for j, k in enumerate(keys)}
    sums = np.zeros((len(per_seed), len(keys)))
    counts = np.zeros((len(per_seed), len(keys)))
    for s, clusters in enumerate(per_seed):
        for k, (a, n) in clusters.items():
            sums[s, column[k]], counts[s, column[k]] = a, n
    rng = np.random.default_rng(seed)
    out: list[float] = []
    for start in range(0, resamples, chunk):
        r = min(chunk, resamples - start)
        seed_draws = rng.multinomial(len(per_seed), [1 / len(per_seed)] * len(per_seed), size=r)
        key_draws = rng.multinomial(len(keys), [1 / len(keys)] * len(keys), size=r)
        acc = ((seed_draws @ sums) * key_draws).sum(1)
        size = ((seed_draws @ counts) * key_draws).sum(1)
        out += np.divide(acc, size, out=np.zeros_like(acc), where=size > 0).tolist()
    return out


def paired_bootstrap_difference(
    outcomes_a: Sequence[Sequence[int]],
    outcomes_b: Sequence[Sequence[int]],
    resamples: int = 10_000,
    seed: int = 0,
    instances: Sequence[Sequence[str]] | None = None,
) -> tuple[float, float, float]:
    """Pooled success-rate difference a - b and its 95 % interval from :func:`hierarchical_bootstrap` of the paired
    per-episode differences: ``outcomes_x[s][i]`` is 1 if configuration x succeeded on task i of training seed s
    (both played the same tasks); seeds and, within them, instances (``instances[s][i]``) are resampled with the
    pairs kept together."""
    if len(outcomes_a) != len(outcomes_b):
        raise ValueError("outcomes_a and outcomes_b must have one list per seed")
    diffs = []
    for s, (a, b) in enumerate(zip(outcomes_a, outcomes_b, strict=True)):
        if len(a) != len(b):
            raise ValueError(
                f"seed index {s}: {len(a)} vs {len(b)} outcomes; the configurations must share tasks"
            )
        diffs.append([x - y for x, y in zip(a, b, strict=True)])
    return hierarchical_bootstrap(diffs, instances, resamples, seed)


def compare(
    per_seed: Mapping[int, Sequence[Mapping[str, Any]]],
    pairs: Sequence[tuple[str, str]],
    decodings: Sequence[str] = ("greedy",),
    resamples: int = 10_000,
    versus_best: Sequence[tuple[str, str]] = (),
    versus_reference: Sequence[tuple[str, str]] = (),
) -> list[dict[str, Any]]:
    """The ``comparisons`` of ``summary.json`` (see the module docstring): every pair (a, b) under every decoding
    (both players decode alike), and for the pairs of ``versus_best`` also a under each decoding against b under b's
    best decoding of that stage (so that sharpening by RL is never sold as learning: RL against its SFT start at the
    start's best). ``versus_reference``: a under each decoding against a reference row b that has one decoding (the
    scripted oracle: greedy; the random policy: sampled). Pairs whose rows are missing are skipped."""
    seeds = sorted(per_seed)

    def row(seed: int, configuration: str, stage: str, decoding: str) -> Mapping[str, Any] | None:
        for r in per_seed[seed]:
            if (r["configuration"], r["stage"], r["decoding"]) == (configuration, stage, decoding):
                return r
        return None

    def pooled(configuration: str, stage: str, decoding: str) -> float:
        cells = [row(s, configuration, stage, decoding) for s in seeds]
        if any(c is None for c in cells):
            return -1.0
        return sum(sum(c["outcomes"]) for c in cells) / max(sum(len(c["outcomes"]) for c in cells), 1)

    stages = list(dict.fromkeys(r["stage"] for seed in seeds for r in per_seed[seed]))
    plan = [(a, d, b, d) for d in decodings for a, b in pairs]
    for a, b in versus_best:
        for d in decodings:
            plan.append((a, d, b, "best"))
    for a, b in versus_reference:
        for d in decodings:
            plan.append((a, d, b, "reference"))
    out = []
    for a, decoding_a, b, decoding_b in plan:
        for stage in stages:
            if decoding_b == "reference":  # the one decoding the reference row has at this stage
                own = {
                    r["decoding"]
                    for r in per_seed[seeds[0]]
                    if (r["configuration"], r["stage"]) == (b, stage)
                }
                if len(own) != 1:
                    continue
                chosen_b = own.pop()
            elif decoding_b == "best":
                best = max(decodings, key=lambda d, b=b, stage=stage: pooled(b, stage, d))
                if best == decoding_a:
                    continue  # the same-decoding comparison says it already
                chosen_b = best
            else:
                chosen_b = decoding_b
            ra = [row(s, a, stage, decoding_a) for s in seeds]
            rb = [row(s, b, stage, chosen_b) for s in seeds]
            if any(r is None for r in ra + rb) or not any(r["outcomes"] for r in ra):
                continue  # a missing row, or no held-out episode left (restrict_to_unseen)
            oa, ob = [list(r["outcomes"]) for r in ra], [list(r["outcomes"]) for r in rb]
            keys = [_instance_keys(r, i) for i, r in enumerate(ra)]
            if keys != [_instance_keys(r, i) for i, r in enumerate(rb)]:
                raise ValueError(f"{a!r} and {b!r} did not play the same instances of stage {stage!r}")
            # seeded by the comparison itself: its interval does not depend on which other pairs are compared
            seed = derive_seed("comparison", a, decoding_a, b, chosen_b, stage)
            diff, low, high = paired_bootstrap_difference(oa, ob, resamples, seed=seed, instances=keys)
            per_seed_diff = [(sum(x) - sum(y)) / len(x) if x else None for x, y in zip(oa, ob, strict=True)]
            t = t_interval(per_seed_diff)
            out.append(
                {
                    "a": a,
                    "b": b,
                    "stage": stage,
                    "decoding": decoding_a,
                    "decoding_b": chosen_b,
                    "diff": diff,
                    "ci_low": low,
                    "ci_high": high,
                    "t_low": t[0] if t else None,
                    "t_high": t[1] if t else None,
                    "per_seed_diff": per_seed_diff,
                    "seeds_agree": len({d > 0 for d in per_seed_diff if d}) <= 1,
                    "episodes": sum(len(x) for x in oa),
                    "method": f"paired bootstrap over seeds and problem instances ({resamples} resamples; "
                    "instances crossed with seeds where they repeat across seeds); t interval over the per-seed "
                    "differences",
                }
            )
    return out


def optimal_naming_rate(row: Mapping[str, Any]) -> float | None:
    """The closed-loop rate at which a row's reflections name an optimal move: ``named_right / known`` of its
    reflection diagnostics (None for a row without reflections, or whose environment told no optimal moves)."""
    diagnostics = row.get("diagnostics") or {}
    known = diagnostics.get("known", 0)
    return diagnostics.get("named_right", 0) / known if known else None


def compare_naming_rates(
    per_seed: Mapping[int, Sequence[Mapping[str, Any]]],
    pairs: Sequence[tuple[str, str]],
    decodings: Sequence[str] = ("greedy",),
) -> list[dict[str, Any]]:
    """For every pair (a, b), stage and decoding: the difference of the closed-loop optimal-naming rates
    (:func:`optimal_naming_rate`) of a and b, per seed and pooled over the seeds' turns, with a t interval over the
    per-seed differences (the seed is the unit: a turn's naming depends on the turns before it). Pairs without the
    diagnostics on every seed are skipped."""
    seeds = sorted(per_seed)

    def row(seed: int, configuration: str, stage: str, decoding: str) -> Mapping[str, Any] | None:
        return next(
            (
                r
                for r in per_seed[seed]
                if (r["configuration"], r["stage"], r["decoding"]) == (configuration, stage, decoding)
            ),
            None,
        )

    def pooled(rows: Sequence[Mapping[str, Any]]) -> float:
        counts = _sum_counts([r.get("diagnostics") or {} for r in rows])
        return counts.get("named_right", 0) / max(counts.get("known", 0), 1)

    stages = list(dict.fromkeys(r["stage"] for seed in seeds for r in per_seed[seed]))
    out = []
    for decoding in decodings:
        for a, b in pairs:
            for stage in stages:
                ra = [row(s, a, stage, decoding) for s in seeds]
                rb = [row(s, b, stage, decoding) for s in seeds]
                if any(r is None for r in ra + rb):
                    continue
                rates_a = [optimal_naming_rate(r) for r in ra]
                rates_b = [optimal_naming_rate(r) for r in rb]
                if any(x is None for x in rates_a + rates_b):
                    continue
                per_seed_diff = [x - y for x, y in zip(rates_a, rates_b, strict=True)]
                t = t_interval(per_seed_diff)
                out.append(
                    {
                        "a": a,
                        "b": b,
                        "stage": stage,
                        "decoding": decoding,
                        "rate_a": pooled(ra),
                        "rate_b": pooled(rb),
                        "diff": pooled(ra) - pooled(rb),
                        "t_low": t[0] if t else None,
                        "t_high": t[1] if t else None,
                        "per_seed_diff": per_seed_diff,
                        "method": "closed-loop share of turns whose reflection names an optimal move, pooled over "
                        "the seeds' turns; t interval (95 %) over the per-seed differences",
                    }
                )
    return out


def restrict_to_unseen(
    per_seed: Mapping[int, Sequence[Mapping[str, Any]]], training: Mapping[int, Mapping[str, set[str]]]
) -> dict[int, list[dict[str, Any]]]:
    """Every seed's results restricted to the held-out episodes whose problem instance was not among that seed's
    training tasks (``training[seed][stage]``: instance keys), counts recomputed."""
    out: dict[int, list[dict[str, Any]]] = {}
    for seed, results in per_seed.items():
        out[seed] = []
        for r in results:
            seen = training.get(seed, {}).get(r["stage"], set())
            keep = [k not in seen for k in r["instances"]]
            outcomes = [o for o, ok in zip(r["outcomes"], keep, strict=True) if ok]
            out[seed].append(
                {
                    **r,
                    "outcomes": outcomes,
                    "instances": [k for k, ok in zip(r["instances"], keep, strict=True) if ok],
                    "episodes": len(outcomes),
                    "successes": sum(outcomes),
                    "success_rate": sum(outcomes) / len(outcomes) if outcomes else 0.0,
                }
            )
    return out


def attach_unseen(
    rows: list[dict[str, Any]],
    comparisons: list[dict[str, Any]],
    unseen_rows: Sequence[Mapping[str, Any]],
    unseen_comparisons: Sequence[Mapping[str, Any]],
) -> None:
    """Put the results on unseen instances (:func:`pool_rows` / :func:`compare` of :func:`restrict_to_unseen`'s
    results) beside those on all held-out episodes, in place: each row's ``unseen`` gets its interval and per-seed
    rates, and ``seen_share`` (the share of its episodes whose instance a training task of the seed posed); each
    comparison gets ``unseen`` (diff, both intervals, per-seed differences, episodes) and ``seen_share``. A stage
    without unseen episodes keeps ``unseen`` without a rate (rows) or gets ``"unseen": None`` (comparisons)."""
    by_row = {(r["configuration"], r["stage"], r["decoding"]): r for r in unseen_rows}
    for row in rows:
        if "unseen" not in row:
            continue
        row["seen_share"] = row["seen"]["episodes"] / row["episodes"] if row["episodes"] else None
        match = by_row.get((row["configuration"], row["stage"], row["decoding"]))
        if match is not None:
            row["unseen"].update(
                ci_low=match["ci_low"], ci_high=match["ci_high"], per_seed=list(match["per_seed"])
            )
    keys = ("a", "b", "stage", "decoding", "decoding_b")
    by_comparison = {tuple(c[k] for k in keys): c for c in unseen_comparisons}
    for c in comparisons:
        match = by_comparison.get(tuple(c[k] for k in keys))
        unseen_episodes = match["episodes"] if match is not None else 0
        c["seen_share"] = 1.0 - unseen_episodes / c["episodes"] if c.get("episodes") else None
        c["unseen"] = (
            None
            if match is None
            else {
                k: match[k]
                for k in (
                    "diff",
                    "ci_low",
                    "ci_high",
                    "t_low",
                    "t_high",
                    "per_seed_diff",
                    "seeds_agree",
                    "episodes",
                )
            }
        )
