"""The rollout throughput benchmark runs end to end on a nano model (no timing assertions), and the speed paths
it measures (shared-prefix KV reuse, static cache) give the same results as plain left-padded batches."""

from __future__ import annotations

import json
import math

import pytest
import torch

from _benchmarks import load_benchmark
from reflect_trl.action_head import OptionHead
from reflect_trl.batching import shared_prefix_length
from reflect_trl.envs import make_env
from reflect_trl.envs.taxi import taxi_dynamics
from reflect_trl.prompts import build_prompt, reflection_prompt
from reflect_trl.reflection.model import ReflectionModel
from reflect_trl.rollout import PolicyActor


@pytest.fixture(scope="module")
def bench():
    """benchmarks/rollout_throughput.py, imported as a module."""
    return load_benchmark("rollout_throughput")


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_benchmark_reports_every_column_and_writes_json(
    bench, tiny_model_dir, tmp_path, capsys, restore_threads
):
    out = tmp_path / "bench" / "rollout.json"
    argv = ["--model_name_or_path", tiny_model_dir, "--batch_sizes", "2", "--repeats", "1"]
    argv += ["--reflection_tokens", "3", "--turns", "2", "--threads", "1", "--profile", "--output", str(out)]
    record = bench.main(argv)

    assert json.loads(out.read_text()) == json.loads(json.dumps(record, default=str))
    machine = record["machine"]
    assert (
        machine["torch_threads"] == 1 and machine["cpu_count"] >= 1 and machine["torch"] == torch.__version__
    )
    assert machine["model_params"]["reflection"] > 0 and machine["model_params"]["policy"] > 0
    (result,) = record["results"]
    assert result["batch_size"] == 2
    for method in ("ours", "naive", "limit"):
        summary = result[method]
        for key in ("env_steps_per_s", "reflection_tokens_per_s", "median_seconds", "median_cpu_seconds"):
            assert _positive(summary[key]), (method, key, summary[key])
        (raw,) = result["raw"][method]
        assert raw["env_steps"] == 2 * 2, "the forgiving taxi keeps both episodes for all turns"
        assert 0 < raw["reflection_tokens"] <= 2 * 2 * 3
    assert result["limit"]["mean_reflection_tokens_per_step"] == 3, "the limit generates exactly the budget"
    for key in ("ours_over_naive_speedup", "ours_over_limit_time", "ours_over_naive_speedup_cpu"):
        assert _positive(result[key]), key
    assert result["raw"]["ours"][0]["turn_batch_sizes"] == [2, 2]
    assert set(record["profile"]["phases_share"]) == set(bench.PROFILE_PHASES)
    assert record["profile"]["top_ops"], "operator profile present"

    table = capsys.readouterr().out
    header, _, row = table.splitlines()[:3]
    assert header.split()[0] == "batch" and "ours/limit" in header
    assert row.split()[0] == "2" and len(row.split()) == len(bench.COLUMNS)


def test_forgiving_taxi_wastes_a_step_instead_of_crashing(bench):
    env = make_env(bench.BENCH_ENV, horizon=3)
    env.reset(task=env.make_tasks("test", 1, difficulty="full")[0])
    crash = next(a for a in range(6) if taxi_dynamics().next_state[env.state][a] == env.state)  # no effect
    for k in range(3):
        _, _, terminated, truncated, info = env.step(crash if k == 0 else env.oracle_action())
        assert not info["crash"] and not terminated
        assert truncated == (k == 2)


def _taxi_prompts(n: int) -> list:
    env = make_env("taxi")
    return [(obs.text, obs.actions) for obs in (env.reset(task=t) for t in env.make_tasks("test", n))]


def test_shared_prefix_and_static_cache_reflections_equal_plain_generate(tiny_model_dir, restore_threads):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    prompts = [reflection_prompt(text) for text, _ in _taxi_prompts(5)]  # mixed modes: different lengths
    assert shared_prefix_length(ReflectionModel(model, tok).tokenize(prompts), 16) > 16
    plain = ReflectionModel(
        model,
        tok,
        max_new_tokens=6,
        temperature=0,
        shared_prefix_min_tokens=0,
        cache_implementation="dynamic",
    )
    expected = plain.generate(prompts)
    for cache in ("static", "dynamic"):
        fast = ReflectionModel(model, tok, max_new_tokens=6, temperature=0, cache_implementation=cache)
        got = fast.generate(prompts)
        assert (got.texts, got.num_tokens, got.stopped) == (
            expected.texts,
            expected.num_tokens,
            expected.stopped,
        )
        assert fast._fast_path_ok is True


def test_shared_prefix_policy_forward_equals_plain_forward(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    head = OptionHead(tok)
    ids = [
        tok(build_prompt(text, actions, "go " * i).text, add_special_tokens=False)["input_ids"]
        for i, (text, actions) in enumerate(_taxi_prompts(4))
    ]
    value_head = torch.nn.Linear(model.config.n_embd, 1)
    fast = PolicyActor(model, tok, head, greedy=True, value_fn=value_head)
    plain = PolicyActor(model, tok, head, greedy=True, value_fn=value_head, shared_prefix_min_tokens=0)
    got, expected = fast.act(ids, [6] * 4), plain.act(ids, [6] * 4)
    assert got[0] == expected[0]
    for a, b in zip(got[1:], expected[1:], strict=True):
        assert a == pytest.approx(b, abs=1e-5)


def test_policy_falls_back_to_plain_forwards_when_the_model_rejects_a_cache(tiny_model_dir, caplog):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    inner = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()

    class NoCacheArgument(torch.nn.Module):  # a forward without the ``cache`` argument
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(
            self, input_ids, attention_mask, position_ids=None, use_cache=False, logits_to_keep=0, **kw
        ):
            if "cache" in kw:
                raise TypeError("forward() got an unexpected keyword argument 'cache'")
            return self.inner(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=use_cache,
                logits_to_keep=logits_to_keep,
                **kw,
            )

    head = OptionHead(tok)
    ids = [
        tok(build_prompt(text, actions, "x").text, add_special_tokens=False)["input_ids"]
        for text, actions in _taxi_prompts(3)
    ]
    wrapped = NoCacheArgument()
    with caplog.at_level("WARNING"):
        got = PolicyActor(wrapped, tok, head, greedy=True).act(ids, [6] * 3)
    assert "cannot reuse a shared-prefix KV cache" in caplog.text
    expected = PolicyActor(inner, tok, head, greedy=True, shared_prefix_min_tokens=0).act(ids, [6] * 3)
    assert got[0] == expected[0] and got[1] == pytest.approx(expected[1], abs=1e-5)
