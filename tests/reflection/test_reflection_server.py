"""The served reflection player (``RemoteReflectionModel``) against real completions servers on 127.0.0.1.

The fast tests use the stdlib server of ``_completions_server`` (real sockets, scripted faults) in front of a tiny
reflection model trained for a few seconds to write reflections and stop; the slow one runs the same model behind
``transformers serve``. No HTTP layer is mocked.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch
from _completions_server import Choice, CompletionsServer, HFCompletions, scripted
from _openai_server import free_port, running, transformers_serve
from _tiny_reflector import reflection_pairs, train_tiny_reflector

from reflect_trl.action_head import OptionHead
from reflect_trl.envs import make_env
from reflect_trl.prompts import STOP_MARKER, encode_prompts
from reflect_trl.reflection.model import ReflectionModel
from reflect_trl.reflection.player import REFLECTION_BACKENDS, ReflectionPlayer, make_reflection_player
from reflect_trl.reflection.remote import (
    DEFAULT_API_KEY_ENV,
    ReflectionServerError,
    RemoteReflectionModel,
    parse_completions,
)
from reflect_trl.rollout import PolicyActor, RolloutEngine

pytestmark = pytest.mark.timeout(180)

BUDGET = 24  # some reflections of the tiny reflector stop within it, others use it up


@pytest.fixture(scope="module")
def reflector_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tiny_reflector(tmp_path_factory.mktemp("tiny_reflector"), reflection_pairs())


@pytest.fixture(scope="module")
def hf(reflector_dir: Path) -> HFCompletions:
    return HFCompletions(reflector_dir)


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    """Held-out states (other tasks than the training ones)."""
    return [p for p, _ in reflection_pairs(n_tasks=4, steps=2, seed=7)]


@pytest.fixture(scope="module")
def in_process(reflector_dir: Path, prompts: list[str]):
    """The in-process player's greedy reflections of ``prompts`` (the reference)."""
    model = ReflectionModel(*_load(reflector_dir), max_new_tokens=BUDGET, temperature=0.0)
    return model.generate(prompts)


def _load(model_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)


def player(base_url: str, **overrides) -> RemoteReflectionModel:
    options = dict(
        max_new_tokens=BUDGET,
        temperature=0.0,
        timeout=10.0,
        max_retries=0,
        backoff_base=0.01,
        backoff_max=0.05,
        concurrency=4,
    )
    options.update(overrides)
    return RemoteReflectionModel(base_url, options.pop("model", "tiny-reflector"), **options)


# ------------------------------------------------------------------------------------------- results


def test_greedy_reflections_equal_the_in_process_model(hf, reflector_dir, prompts, in_process):
    assert any(in_process.stopped) and not all(in_process.stopped)  # both cases are exercised
    tokenizer = _load(reflector_dir)[1]
    with running(CompletionsServer(hf)) as srv, player(srv.base_url, tokenizer=tokenizer) as remote:
        batch = remote.generate(prompts)
    assert batch.texts == in_process.texts
    assert batch.num_tokens == in_process.num_tokens
    assert batch.stopped == in_process.stopped
    assert batch.prompt_ids == in_process.prompt_ids == encode_prompts(tokenizer, prompts)
    # One request per prompt, carrying exactly the in-process prompt text, budget, sampling and stop marker.
    assert srv.log.requests == len(prompts)
    assert sorted(b["prompt"] for b in srv.log.bodies) == sorted(prompts)
    body = srv.log.bodies[0]
    assert (
        body["stop"] == [STOP_MARKER] and body["max_tokens"] == BUDGET and body["model"] == "tiny-reflector"
    )
    assert body["temperature"] == 0.0 and body["top_p"] == 1.0 and "seed" not in body


def test_concurrent_requests_are_bounded_and_results_keep_input_order(hf, prompts, in_process):
    assert len(set(in_process.texts)) >= 6  # distinct answers, so the order check means something
    slow = CompletionsServer(hf, delay=(0.05, 0.3), seed=1)  # requests overlap and finish shuffled
    with running(slow), player(slow.base_url, concurrency=3) as remote:
        batch = remote.generate(prompts)
    assert slow.log.max_in_flight == 3
    assert batch.texts == in_process.texts and batch.stopped == in_process.stopped


def test_lists_of_prompts_per_request_keep_input_order(hf, reflector_dir, prompts, in_process):
    tokenizer = _load(reflector_dir)[1]
    # Choices come back in reverse order with their index, as the API allows.
    with running(CompletionsServer(hf, shuffle_choices=True)) as srv:
        batch = player(srv.base_url, prompts_per_request=3).generate(prompts)
    assert srv.log.requests == math.ceil(len(prompts) / 3)
    chunks = [prompts[k : k + 3] for k in range(0, len(prompts), 3)]
    assert sorted(json.dumps(b["prompt"]) for b in srv.log.bodies) == sorted(json.dumps(c) for c in chunks)
    assert batch.texts == in_process.texts and batch.stopped == in_process.stopped
    assert batch.prompt_ids == [[] for _ in prompts]  # no local tokenizer
    # A list answer has no per-choice token counts: 0 without a local tokenizer, ...
    assert batch.num_tokens == [0] * len(prompts)
    with running(CompletionsServer(hf)) as srv:
        recounted = player(srv.base_url, prompts_per_request=3, tokenizer=tokenizer).generate(prompts)
    assert recounted.texts == in_process.texts
    # ... else re-counted locally (text + stop token, capped at the budget): exact for the trained model's text.
    assert recounted.num_tokens == in_process.num_tokens


def test_max_prompt_length_truncates_like_the_in_process_model(hf, reflector_dir, prompts):
    model, tokenizer = _load(reflector_dir)
    limit = 150
    assert any(len(x) > limit for x in encode_prompts(tokenizer, prompts))
    reference = ReflectionModel(
        model, tokenizer, max_new_tokens=BUDGET, temperature=0.0, max_prompt_length=limit
    )
    expected = reference.generate(prompts)
    with running(CompletionsServer(hf)) as srv:
        batch = player(srv.base_url, tokenizer=tokenizer, max_prompt_length=limit).generate(prompts)
    assert batch.prompt_ids == expected.prompt_ids and all(len(x) <= limit for x in batch.prompt_ids)
    assert batch.texts == expected.texts and batch.num_tokens == expected.num_tokens
    sent = {json.dumps(b["prompt"]) for b in srv.log.bodies}
    for text, ids in zip(prompts, batch.prompt_ids, strict=True):  # truncated prompts go out as token ids
        assert json.dumps(ids if len(ids) == limit else text) in sent
    with pytest.raises(ValueError, match="max_prompt_length=150 needs the reflection model's tokenizer"):
        player(srv.base_url, max_prompt_length=limit)


def test_stop_marker_budget_and_token_counts():
    answers = {
        "a": Choice(
            "Because I am at row 2, so I move north.", "stop", 9
        ),  # the stop string is cut off (vLLM)
        "b": Choice("move south then move west then", "length", 24),  # budget used up: not an error
        "c": Choice(f"go east{STOP_MARKER} junk", "length", 24),  # a server that returns the marker itself
        "d": Choice("move west", "eos_token", 3),  # TGI's name for an EOS stop
    }
    with running(CompletionsServer(scripted(answers))) as srv:
        batch = player(srv.base_url).generate(["a", "b", "c", "d"])
    assert batch.texts == [answers["a"].text, answers["b"].text, "go east", "move west"]
    assert batch.stopped == [True, False, True, True]
    assert batch.num_tokens == [9, 24, 24, 3]  # usage.completion_tokens of each single-prompt request


def test_parse_completions_rejects_what_it_cannot_use():
    ok = {"choices": [{"index": 1, "text": "b", "finish_reason": "stop"}, {"index": 0, "text": "a"}]}
    assert [c.text for c in parse_completions(ok, 2)] == ["a", "b"]
    for answer, message in [
        ({"error": {"message": "overloaded"}}, "error object"),
        ({"object": "text_completion"}, "without a choices list"),
        ({"choices": [{"text": "a"}]}, "1 choice"),
        ({"choices": [{"index": 0, "message": {"content": "a"}}, {"index": 1, "text": "b"}]}, "without text"),
        ({"choices": [{"index": 0, "text": "a"}, {"index": 0, "text": "b"}]}, r"indices \[0, 0\]"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_completions(answer, 2)


# ------------------------------------------------------------------------------------------- failures


def test_connection_refused_raises_quickly_naming_the_url():
    base_url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    remote = player(base_url, max_retries=2)
    start = time.monotonic()
    with pytest.raises(ReflectionServerError, match="after 3 attempt") as info:
        remote.generate(["a", "b"])
    assert time.monotonic() - start < 3.0
    assert f"{base_url}/completions" in str(info.value) and "ConnectionRefusedError" in str(info.value)
    assert info.value.url == f"{base_url}/completions"


@pytest.mark.parametrize(
    "fault, error",
    [
        (500, "HTTP 500"),
        (503, "HTTP 503"),
        (429, "HTTP 429"),
        ("not-json", "non-JSON"),
        ("extra-choice", r"2 choice\(s\) for 1 prompt"),
        ("no-choices", "without a choices list"),
        ("drop", "RemoteDisconnected"),
    ],
)
def test_transient_faults_are_retried_then_raise(fault, error):
    answers = scripted(Choice("move north", "stop", 3))
    flaky = CompletionsServer(answers, faults=[fault, fault])
    with running(flaky):
        remote = player(flaky.base_url, max_retries=2)
        assert remote.generate(["state"]).texts == ["move north"]
        assert flaky.log.requests == 3 and remote.endpoint.stats["retries"] == 2
    failing = CompletionsServer(answers, faults=[fault] * 3)
    with running(failing), pytest.raises(ReflectionServerError, match=error) as info:
        player(failing.base_url, max_retries=2).generate(["state"])
    assert failing.log.requests == 3 and "after 3 attempt" in str(info.value)
    assert f"{failing.base_url}/completions" in str(info.value)


def test_timeouts_are_retried_and_never_hang():
    answers = scripted(Choice("move north", "stop", 3))
    stalling = CompletionsServer(answers, faults=["stall", "stall"], stall=5.0)
    with running(stalling):
        remote = player(stalling.base_url, timeout=0.2, max_retries=1)
        start = time.monotonic()
        with pytest.raises(ReflectionServerError, match="timed out") as info:
            remote.generate(["state"])
        assert time.monotonic() - start < 2.0  # two 0.2 s timeouts, not the server's 5 s
        assert "after 2 attempt" in str(info.value) and "timeout=0.2s" in str(info.value)
        assert remote.generate(["state"]).texts == ["move north"]  # the faults are used up


def test_the_call_deadline_bounds_retries_and_slow_batches():
    answers = scripted(Choice("move north", "stop", 3))
    slow = CompletionsServer(answers, delay=(2.0, 2.0))
    with running(slow):
        remote = player(slow.base_url, timeout=5.0, max_retries=3, deadline=0.5, concurrency=2)
        start = time.monotonic()
        with pytest.raises(ReflectionServerError, match=r"deadline") as info:
            remote.generate(["a", "b", "c", "d"])  # two waves of 2 s each, deadline 0.5 s
        assert time.monotonic() - start < 2.0
        assert slow.base_url in str(info.value)
        # A single prompt is sent from the calling thread: the deadline caps each attempt's socket timeout.
        start = time.monotonic()
        with pytest.raises(ReflectionServerError, match=r"ran out of its 0.5s deadline after 1 attempt"):
            remote.generate(["a"])
        assert time.monotonic() - start < 1.2
    # The default deadline allows every wave of requests all its attempts.
    assert player("http://127.0.0.1:1/v1", timeout=2.0, max_retries=1, concurrency=4).call_deadline(
        8
    ) == 2 * (2 * 2.0 + 1 * 0.05)


def test_one_failing_request_fails_the_call_and_cancels_the_rest():
    answers = scripted(Choice("move north", "stop", 3))
    srv = CompletionsServer(answers, faults=[400], delay=(0.2, 0.2))
    with running(srv), player(srv.base_url, max_retries=3, concurrency=1) as remote:
        start = time.monotonic()
        with pytest.raises(ReflectionServerError, match="rejected the request with HTTP 400"):
            remote.generate([f"state {i}" for i in range(6)])
        assert time.monotonic() - start < 1.0
        time.sleep(0.3)
    assert srv.log.requests <= 2  # the 400 is not retried, the queued requests are never sent


def test_client_errors_are_not_retried_and_name_the_key_variable(monkeypatch):
    monkeypatch.delenv("MY_REFLECTION_KEY", raising=False)
    rejecting = CompletionsServer(scripted(Choice("x", "stop", 1)), faults=[401])
    with running(rejecting), pytest.raises(ReflectionServerError, match=r"HTTP 401.*\$MY_REFLECTION_KEY"):
        player(rejecting.base_url, max_retries=3, api_key_env="MY_REFLECTION_KEY").generate(["state"])
    assert rejecting.log.requests == 1


def test_api_key_comes_from_the_named_env_var(monkeypatch):
    monkeypatch.delenv(DEFAULT_API_KEY_ENV, raising=False)
    with running(CompletionsServer(scripted(Choice("x", "stop", 1)))) as srv:
        remote = player(srv.base_url)
        remote.generate(["state"])
        monkeypatch.setenv(DEFAULT_API_KEY_ENV, "sk-local-test")
        remote.generate(["state"])
    first, second = ({k.lower(): v for k, v in h.items()} for h in srv.log.headers)
    assert "authorization" not in first
    assert second["authorization"] == "Bearer sk-local-test"


def test_seeds_differ_per_prompt_and_call_and_are_reproducible():
    with running(CompletionsServer(scripted(Choice("x", "stop", 1)))) as srv:
        player(srv.base_url, seed=5, temperature=1.0).generate(["s", "s", "t"])
        player(srv.base_url, seed=5, temperature=1.0).generate(["s", "s", "t"])
        again = player(srv.base_url, seed=5, temperature=1.0)
        again.generate(["s"])
        again.generate(["s"])
    seeds = [b["seed"] for b in srv.log.bodies]
    first, second, calls = seeds[:3], seeds[3:6], seeds[6:]
    assert len(set(first)) == 3 and sorted(first) == sorted(second)
    assert calls[0] in first and calls[1] not in first  # the next call (turn) gets new seeds


# ------------------------------------------------------------------------------------------- wiring


def test_factory_returns_either_backend(reflector_dir):
    model, tokenizer = _load(reflector_dir)
    local = make_reflection_player("hf", model=model, tokenizer=tokenizer, max_new_tokens=7, temperature=0.0)
    assert isinstance(local, ReflectionModel) and local.max_new_tokens == 7
    remote = make_reflection_player(
        "openai",
        base_url="http://127.0.0.1:8000/v1/",
        model_name="refl",
        max_new_tokens=7,
        temperature=0.5,
        top_p=0.9,
        concurrency=3,
        timeout=4.0,
        max_retries=1,
        api_key_env="K",
        prompts_per_request=2,
    )
    assert isinstance(remote, RemoteReflectionModel) and remote.url == "http://127.0.0.1:8000/v1/completions"
    assert remote.payload(["p"]) == {
        "model": "refl",
        "prompt": "p",
        "max_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": [STOP_MARKER],
    }
    assert (remote.concurrency, remote.endpoint.timeout, remote.endpoint.max_retries) == (3, 4.0, 1)
    assert remote.endpoint.api_key_env == "K" and remote.prompts_per_request == 2 and remote.tokenizer is None
    assert isinstance(local, ReflectionPlayer) and isinstance(remote, ReflectionPlayer)
    assert REFLECTION_BACKENDS == ("hf", "openai")
    with pytest.raises(ValueError, match="needs the server's base_url"):
        make_reflection_player("openai", model_name="refl")
    with pytest.raises(ValueError, match="needs the loaded reflection model"):
        make_reflection_player("hf")
    with pytest.raises(ValueError, match="do not load it locally"):
        make_reflection_player("openai", base_url="http://127.0.0.1:1/v1", model_name="m", model=model)
    with pytest.raises(ValueError, match=r"'vllm' is unknown; choose one of \('hf', 'openai'\)"):
        make_reflection_player("vllm")
    with pytest.raises(ValueError, match="must be an http"):
        make_reflection_player("openai", base_url="127.0.0.1:8000/v1", model_name="m")


def _rollout(reflection, model, tokenizer, tasks):
    actor = PolicyActor(model, tokenizer, OptionHead(tokenizer), greedy=True)
    return RolloutEngine("taxi", actor, reflection).run(tasks)


def test_rollout_with_the_served_player_equals_the_in_process_rollout(hf, reflector_dir):
    model, tokenizer = _load(reflector_dir)  # the tiny reflector also plays the policy (greedy)
    tasks = make_env("taxi").make_tasks("test", 6, seed=3, difficulty="pickup")
    local = ReflectionModel(model, tokenizer, max_new_tokens=BUDGET, temperature=0.0)
    expected = [ep.transcript() for ep in _rollout(local, model, tokenizer, tasks)]
    with running(CompletionsServer(hf)) as srv, player(srv.base_url, tokenizer=tokenizer) as remote:
        episodes = _rollout(remote, model, tokenizer, tasks)
    assert [ep.transcript() for ep in episodes] == expected
    turns = sum(len(ep["turns"]) for ep in expected)
    assert srv.log.requests == turns  # one request per live episode per turn
    assert [t.prompt_ids for ep in episodes for t in ep.turns] == [
        t.prompt_ids for ep in _rollout(local, model, tokenizer, tasks) for t in ep.turns
    ]


def test_rollout_with_a_served_player_without_local_tokenizer(reflector_dir):
    model, tokenizer = _load(reflector_dir)
    with running(CompletionsServer(scripted(Choice("move north", "stop", 3)))) as srv:
        tasks = make_env("taxi").make_tasks("test", 2, seed=3, difficulty="pickup")
        episodes = _rollout(player(srv.base_url), model, tokenizer, tasks)
    assert all(t.reflection == "move north" for ep in episodes for t in ep.turns)


# ------------------------------------------------------------------------------------------- transformers serve


@pytest.mark.slow  # starting `transformers serve` takes ~5-15 s on 2 CPU cores
def test_transformers_serve_greedy_reflections_equal_the_in_process_model(reflector_dir, prompts, in_process):
    for module in ("fastapi", "uvicorn", "openai"):
        pytest.importorskip(module, reason="`transformers serve` needs transformers[serving]")
    tokenizer = _load(reflector_dir)[1]
    with transformers_serve(reflector_dir) as srv:
        # `transformers serve` loads the model named in the request
        remote = player(srv.base_url, model=str(reflector_dir), tokenizer=tokenizer, timeout=60.0)
        batch = remote.generate(prompts)
        srv.settle()
        assert srv.posts("/v1/completions") == len(prompts)
        # It serves one string prompt per request: a list is rejected (HTTP 400), at once and clearly.
        with pytest.raises(ReflectionServerError, match="HTTP 400.*prompt must be a string"):
            player(srv.base_url, model=str(reflector_dir), prompts_per_request=2, max_retries=2).generate(
                prompts[:2]
            )
    assert any(in_process.stopped) and not all(in_process.stopped)
    assert batch.texts == in_process.texts
    assert batch.num_tokens == in_process.num_tokens
    # `transformers serve` says "length" whenever the budget is reached, also when the budget's last token was
    # the marker (the marker, a special token of the tiny tokenizer, is not in its text either): `stopped` can
    # differ from the in-process model only there.
    for got, want, n in zip(batch.stopped, in_process.stopped, in_process.num_tokens, strict=True):
        assert got == want or n == BUDGET
    assert batch.prompt_ids == in_process.prompt_ids


@pytest.mark.slow  # starts a server subprocess and builds a model
def test_throughput_benchmark_runs_end_to_end(tmp_path):
    from _benchmarks import load_benchmark

    # the script imports its sibling by name, as when run from benchmarks/
    load_benchmark("rollout_throughput")
    bench = load_benchmark("reflection_server_throughput")
    threads = torch.get_num_threads()
    out = tmp_path / "bench.json"
    argv = ["--tiny_preset", "nano", "--batch_sizes", "2", "--repeats", "1", "--turns", "2"]
    argv += [
        "--reflection_tokens",
        "3",
        "--backends",
        "in-process,batched,batched-list",
        "--output",
        str(out),
    ]
    try:
        record = bench.main(argv)
    finally:
        torch.set_num_threads(threads)
    assert json.loads(out.read_text()) == json.loads(json.dumps(record, default=str))
    assert [r["backend"] for r in record["results"]] == ["in-process", "batched", "batched-list"]
    for result in record["results"]:
        assert result["env_steps_per_s"] > 0 and result["reflection_tokens_per_step"] > 0
        assert [run["env_steps"] for run in result["raw"]] == [4]
    served = record["results"][1]["raw"][0]
    assert served["server_cpu_seconds"] >= 0 and served["reflection_seconds"] > 0
