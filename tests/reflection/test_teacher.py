"""The teacher reflector against real OpenAI-compatible servers on 127.0.0.1 (no mocked HTTP layer).

The fast tests use a stdlib HTTP server whose answers come from ``model.generate`` on a tiny local model;
one test runs the same model behind ``transformers serve`` (skipped when its serving extras are missing).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
from _teacher_server import (
    ChatCompletionsServer,
    TinyChatModel,
    add_chat_template,
    free_port,
    running,
    transformers_serve,
)

from reflect_trl.envs.base import Observation
from reflect_trl.prompts import STOP_MARKER
from reflect_trl.reflection.base import ReflectionContext
from reflect_trl.reflection.teacher import (
    SYSTEM_PROMPT,
    TeacherReflector,
    TeacherRequestError,
    TeacherUnavailableError,
    build_messages,
    postprocess,
    request_key,
)
from reflect_trl.tiny_models import build_tiny_model

pytestmark = pytest.mark.timeout(120)

ACTIONS = ["move south", "move north", "move east", "move west", "pickup passenger", "drop off passenger"]
GRID = "+---------+\n| : | : :D|\n| : | : : |\n| :T: : : |\n| | : | : |\n|P| : | : |\n+---------+"


def make_ctx(step: int, last_action: str | None = None, was_oracle: bool | None = None, oracle: int = 2):
    """A Taxi-like decision point (the teacher never touches ``env``)."""
    text = f"You have already completed {step} actions.\n\n--- Current State ---\n\n{GRID}"
    return ReflectionContext(
        env=None,  # type: ignore[arg-type]
        observation=Observation(text=text, actions=list(ACTIONS)),
        step=step,
        oracle_action=oracle,
        last_action=last_action,
        last_action_was_oracle=was_oracle,
        last_reward=None if last_action is None else -0.05,
    )


CONTEXTS = [make_ctx(0)] + [make_ctx(i, ACTIONS[i % 6], i % 3 != 0, oracle=i % 6) for i in range(1, 10)]


def corpus() -> list[str]:
    texts = [SYSTEM_PROMPT] + [m["content"] for ctx in CONTEXTS for m in build_messages(ctx)]
    return texts + ["Because the passenger is west of me, so I move west to reach the pickup."] * 4


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = build_tiny_model(tmp_path_factory.mktemp("teacher_model"), preset="nano", texts=corpus())
    add_chat_template(out)
    return out


@pytest.fixture(scope="module")
def tiny_chat(tiny_model_dir: Path) -> TinyChatModel:
    return TinyChatModel(tiny_model_dir)


@pytest.fixture
def server(tiny_chat: TinyChatModel):
    with running(ChatCompletionsServer(tiny_chat)) as srv:
        yield srv


def teacher(base_url: str, tmp_path: Path, **overrides) -> TeacherReflector:
    options = dict(
        model="tiny-teacher",
        max_tokens=12,
        timeout=10.0,
        cache_dir=tmp_path / "teacher_cache",
        max_retries=0,
        backoff_base=0.01,
        backoff_max=0.05,
    )
    options.update(overrides)
    return TeacherReflector(base_url, **options)


def test_reflection_is_generated_text_from_the_server(server: ChatCompletionsServer, tiny_chat, tmp_path):
    ctx = make_ctx(3, "move north", True, oracle=3)
    text = teacher(server.base_url, tmp_path).reflect(ctx, random.Random(0))

    assert isinstance(text, str) and text.strip() == text and text
    assert STOP_MARKER not in text
    assert server.log.requests == 1
    body = server.log.bodies[0]
    assert body["model"] == "tiny-teacher" and body["max_tokens"] == 12 and body["temperature"] == 0.7
    system, user = body["messages"]
    assert system["role"] == "system" and "60 words" in system["content"] and "Because" in system["content"]
    assert user["role"] == "user"
    assert ctx.observation.text in user["content"]
    assert "move north" in user["content"]
    assert "Spoiler" in user["content"] and "move west" in user["content"]  # oracle action 3 = move west
    # The reflection is what model.generate produced for that request, post-processed.
    assert text == postprocess(tiny_chat(body))


def test_identical_request_is_a_cache_hit(server: ChatCompletionsServer, tmp_path):
    ctx = make_ctx(4, "move east", True)
    first_teacher = teacher(server.base_url, tmp_path)
    text = first_teacher.reflect(ctx)
    assert first_teacher.reflect(ctx) == text
    assert server.log.requests == 1
    assert first_teacher.stats == {"requests": 1, "cache_hits": 1, "retries": 0}

    key = request_key(first_teacher.payload(ctx))
    entry = tmp_path / "teacher_cache" / key[:2] / f"{key}.json"
    assert json.loads(entry.read_text())["request"] == first_teacher.payload(ctx)

    # The cache is on disk: a new reflector (e.g. a re-run) makes no request either.
    assert teacher(server.base_url, tmp_path).reflect(ctx) == text
    assert server.log.requests == 1
    # Sampling parameters are part of the key.
    teacher(server.base_url, tmp_path, temperature=0.3).reflect(ctx)
    assert server.log.requests == 2
    # Identical requests within one batch go out once.
    other = make_ctx(5, "move west", False)
    batch = teacher(server.base_url, tmp_path, max_concurrency=2).reflect_many([other, ctx, other])
    assert batch[0] == batch[2] and batch[1] == text
    assert server.log.requests == 3


def test_reflect_many_keeps_order_and_bounds_concurrency(tiny_chat: TinyChatModel, tmp_path):
    contexts = CONTEXTS[:8]
    slow = ChatCompletionsServer(tiny_chat, delay=(0.05, 0.3), seed=1)  # requests overlap, finish shuffled
    with running(slow):
        reflector = teacher(slow.base_url, tmp_path, max_concurrency=3)
        results = reflector.reflect_many(contexts)
    assert slow.log.requests == 8
    assert slow.log.max_in_flight == 3
    expected = [postprocess(tiny_chat(reflector.payload(ctx))) for ctx in contexts]
    assert results == expected
    assert len(set(results)) == len(results)  # distinct answers, so the order check means something


def test_unreachable_endpoint_raises_quickly_naming_the_url(tmp_path):
    base_url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    start = time.monotonic()
    with pytest.raises(TeacherUnavailableError) as info:
        teacher(base_url, tmp_path, max_retries=0).reflect(make_ctx(0))
    assert time.monotonic() - start < 2.0
    assert base_url in str(info.value) and "1 attempt" in str(info.value)

    reflector = teacher(base_url, tmp_path, max_retries=2)
    start = time.monotonic()
    with pytest.raises(TeacherUnavailableError, match="after 3 attempt"):
        reflector.reflect(make_ctx(0))
    assert time.monotonic() - start < 2.0
    assert reflector.stats["retries"] == 2 and reflector.stats["requests"] == 3


def test_slow_server_times_out_and_is_retried(tiny_chat: TinyChatModel, tmp_path):
    stalling = ChatCompletionsServer(tiny_chat, delay=(5.0, 5.0))
    with running(stalling):
        reflector = teacher(stalling.base_url, tmp_path, timeout=0.2, max_retries=1)
        start = time.monotonic()
        with pytest.raises(TeacherUnavailableError, match="timed out") as info:
            reflector.reflect(make_ctx(6, "move north", True))
        assert time.monotonic() - start < 2.5  # two 0.2 s timeouts, not the server's 5 s
    assert "after 2 attempt" in str(info.value) and "timeout=0.2s" in str(info.value)
    assert stalling.log.requests == 2


def test_server_errors_are_retried_then_succeed(tiny_chat: TinyChatModel, tmp_path):
    flaky = ChatCompletionsServer(tiny_chat, fail_statuses=[500, 500])
    with running(flaky):
        reflector = teacher(flaky.base_url, tmp_path, max_retries=3)
        text = reflector.reflect(make_ctx(2, "move south", True))
    assert text
    assert flaky.log.requests == 3
    assert reflector.stats["retries"] == 2

    busy = ChatCompletionsServer(tiny_chat, fail_statuses=[429, 503, 503])
    with running(busy), pytest.raises(TeacherUnavailableError, match="HTTP 503") as info:
        teacher(busy.base_url, tmp_path, max_retries=1).reflect(make_ctx(3, "move south", True))
    assert busy.base_url in str(info.value)
    assert busy.log.requests == 2


def test_client_errors_are_not_retried(tiny_chat: TinyChatModel, tmp_path):
    rejecting = ChatCompletionsServer(tiny_chat, fail_statuses=[401])
    with running(rejecting), pytest.raises(TeacherRequestError, match=r"HTTP 401.*\$MY_TEACHER_KEY"):
        teacher(rejecting.base_url, tmp_path, max_retries=3, api_key_env="MY_TEACHER_KEY").reflect(
            make_ctx(1)
        )
    assert rejecting.log.requests == 1


def test_api_key_comes_from_the_named_env_var(server: ChatCompletionsServer, tmp_path, monkeypatch):
    monkeypatch.delenv("MY_TEACHER_KEY", raising=False)
    teacher(server.base_url, tmp_path, api_key_env="MY_TEACHER_KEY").reflect(make_ctx(1))
    monkeypatch.setenv("MY_TEACHER_KEY", "sk-local-test")
    teacher(server.base_url, tmp_path, api_key_env="MY_TEACHER_KEY", temperature=0.5).reflect(make_ctx(1))
    first, second = ({k.lower(): v for k, v in h.items()} for h in server.log.headers)
    assert "authorization" not in first
    assert second["authorization"] == "Bearer sk-local-test"


def test_prompt_names_the_mistake_and_hides_the_spoiler_as_such():
    mistake = build_messages(make_ctx(4, "pickup passenger", False, oracle=1))[1]["content"]
    assert "mistake" in mistake and "recover" in mistake
    assert "pickup passenger" in mistake and "move north" in mistake
    assert "never reveal" in mistake.lower()
    good = build_messages(make_ctx(4, "move north", True, oracle=1))[1]["content"]
    assert "mistake" not in good and "two-sentence reflection" in good
    first = build_messages(make_ctx(0))[1]["content"]
    assert "first step" in first and "one-sentence" in first
    assert "Spoiler" in first and "move east" in first
    assert "# Options" not in first  # the options block belongs to the policy prompt only


def test_postprocess_drops_echoed_markers_and_labels():
    echoed = f'Reflection: "Because I hit a wall,\n so I turn east."{STOP_MARKER} junk\n# Options:\nA. move'
    assert postprocess(echoed) == "Because I hit a wall, so I turn east."
    assert postprocess("  plain text  ") == "plain text"


def test_configuration_errors_are_clear():
    with pytest.raises(ValueError, match="unknown teacher config key.*'temprature'"):
        TeacherReflector.from_config({"base_url": "http://127.0.0.1:1/v1", "model": "m", "temprature": 0.1})
    with pytest.raises(ValueError, match="must be an http"):
        TeacherReflector("127.0.0.1:8000/v1", "m")
    reflector = TeacherReflector.from_config(
        {"base_url": "http://127.0.0.1:1/v1/", "model": "m", "max_tokens": 9}
    )
    assert reflector.url == "http://127.0.0.1:1/v1/chat/completions" and reflector.max_tokens == 9


@pytest.mark.slow  # starting `transformers serve` takes ~7-15 s on 2 CPU cores
def test_transformers_serve_end_to_end(tiny_model_dir: Path, tmp_path):
    for module in ("fastapi", "uvicorn", "openai"):
        pytest.importorskip(module, reason="`transformers serve` needs transformers[serving]")
    with transformers_serve(tiny_model_dir) as srv:
        reflector = teacher(srv.base_url, tmp_path, model=str(tiny_model_dir), timeout=60.0)
        ctx = make_ctx(20, "move east", True)
        text = reflector.reflect(ctx)
        assert text and STOP_MARKER not in text
        srv.settle()
        assert srv.posts() == 1

        assert reflector.reflect(ctx) == text  # cache hit: the server's access log shows no new POST
        srv.settle()
        assert srv.posts() == 1

        results = reflector.reflect_many(CONTEXTS[:4])
        srv.settle()
        assert srv.posts() == 5
        assert len(results) == 4 and all(results)
        assert results == [reflector.reflect(c) for c in CONTEXTS[:4]]  # all cached now, same order
