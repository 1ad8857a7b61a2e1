"""A teacher reflector: an OpenAI-compatible chat-completions endpoint writes the reflections.

This is the data-generation role GPT-4 played in Reflect-RL: for each decision point the teacher sees the
state, the last action and (as a spoiler it must not reveal) the best next action, and writes a short
first-person reflection: what the last action did, whether it was good or bad and why, and what to do next.
After an injected mistake it is asked to name the mistake and plan the recovery (the paper's negative
examples).

Any server that speaks ``POST {base_url}/chat/completions`` works: OpenAI, vLLM, ``transformers serve``,
LM Studio, llama.cpp. Only the standard library is used. Responses are cached on disk keyed by the full
request, so re-running a data build costs no requests; transient failures (connection errors, timeouts,
429, 5xx) are retried with seeded, jittered exponential backoff; ``reflect_many`` runs a bounded number of
requests at once and returns results in input order.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from reflect_trl.prompts import clean_reflection
from reflect_trl.reflection.base import ReflectionContext
from reflect_trl.reflection.endpoint import RETRYABLE_STATUSES, OpenAIEndpoint

logger = logging.getLogger(__name__)

MAX_REFLECTION_WORDS = 60

SYSTEM_PROMPT = (
    "You write the inner reflection of an agent that acts in a text-based environment, in the agent's own "
    "voice (first person). You are shown the current state, the action the agent just took, and a spoiler "
    "naming the best next action. Write a short reflection that covers: (1) what the last action led to; "
    "(2) whether it was a good or a bad move, and why; (3) which action to take next, and why. "
    'Write in the style "Because ..., so I ...". '
    f"Use fewer than {MAX_REFLECTION_WORDS} words. "
    "Never reveal or mention the spoiler, a hint, or the word 'optimal': argue for the next action from the "
    "state itself, as if you had worked it out. Reply with the reflection text only."
)


class TeacherError(RuntimeError):
    """Base class of the teacher reflector's errors."""


class TeacherUnavailableError(TeacherError):
    """The endpoint could not be reached, or kept failing, after all retries."""


class TeacherRequestError(TeacherError):
    """The endpoint rejected the request (a non-retryable 4xx) or answered with something unusable."""


def build_messages(ctx: ReflectionContext) -> list[dict[str, str]]:
    """The chat messages (system + user) asking the teacher to reflect on one decision point."""
    parts = ["------ State ------", ctx.observation.text.rstrip()]
    parts += ["------ Legal actions now ------", "; ".join(ctx.observation.actions)]
    if ctx.last_action is None:
        parts += ["------ Last action ------", "none: this is the first step."]
    else:
        parts += ["------ Last action ------", ctx.last_action]
        if ctx.last_reward is not None:
            parts.append(f"(reward received: {ctx.last_reward:g})")
    parts.append(
        f"--- Spoiler (never reveal it): the best action to take next is: {ctx.oracle_action_text} ---"
    )
    if ctx.last_action is None:
        ask = "Give me a one-sentence analysis of what I should do first, and why."
    elif ctx.last_action_was_oracle is False:
        ask = (
            "My last action was a mistake. Give me a two-sentence reflection: name the mistake and why it was "
            "wrong, then how I recover from it with my next action."
        )
    else:
        ask = "Give me a two-sentence reflection."
    parts.append(f"------ {ask} ------")
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n".join(parts)}]


def postprocess(text: str) -> str:
    """Clean a teacher answer into reflection text: no stop marker or options echo, one line, no label."""
    text = clean_reflection(text)
    text = " ".join(text.split())
    for prefix in ("Reflection:", "reflection:", "REFLECTION:"):
        if text.startswith(prefix):
            text = text[len(prefix) :].strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    return text


def request_key(payload: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of a request body (model, messages and sampling parameters)."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class TeacherReflector:
    """Reflections written by an OpenAI-compatible chat endpoint (implements the ``Reflector`` protocol).

    ``base_url`` is the API root, e.g. ``https://api.openai.com/v1`` or ``http://127.0.0.1:8000/v1``; the
    request goes to ``{base_url}/chat/completions``. The API key is read from the environment variable named
    ``api_key_env`` at request time; when it is unset no ``Authorization`` header is sent (local servers).
    ``cache_dir=None`` disables the cache. ``seed`` seeds the backoff jitter; ``request_seed`` (optional) is
    sent as the request's ``seed`` field. ``extra_body`` adds server-specific fields to every request.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        temperature: float = 0.7,
        top_p: float | None = None,
        max_tokens: int = 128,
        timeout: float = 60.0,
        cache_dir: str | Path | None = None,
        max_retries: int = 5,
        backoff_base: float = 1.0,
        backoff_max: float = 30.0,
        max_concurrency: int = 4,
        seed: int = 0,
        request_seed: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"teacher max_tokens must be >= 1, got {max_tokens}")
        if max_concurrency < 1:
            raise ValueError(f"teacher max_concurrency must be >= 1, got {max_concurrency}")
        self.endpoint = OpenAIEndpoint(
            base_url,
            "chat/completions",
            model,
            what="teacher",
            api_key_env=api_key_env,
            timeout=timeout,
            max_retries=max_retries,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            max_concurrency=max_concurrency,
            seed=seed,
            unavailable_error=TeacherUnavailableError,
            request_error=TeacherRequestError,
        )
        self.base_url = self.endpoint.base_url
        self.url = self.endpoint.url
        self.model = model
        self.api_key_env = api_key_env
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.max_concurrency = max_concurrency
        self.request_seed = request_seed
        self.extra_body = dict(extra_body or {})
        self._cache_hits = 0
        self._lock = threading.Lock()

    @property
    def stats(self) -> dict[str, int]:
        """Requests sent (every attempt), cache hits and retries so far."""
        return {**self.endpoint.stats, "cache_hits": self._cache_hits}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TeacherReflector:
        """Build from a config mapping (e.g. a YAML ``teacher:`` section); unknown keys are an error."""
        import inspect

        known = set(inspect.signature(cls.__init__).parameters) - {"self"}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(f"unknown teacher config key(s) {unknown}; known keys: {sorted(known)}")
        return cls(**dict(config))

    # -- the Reflector protocol -------------------------------------------------------------------------

    def reflect(self, ctx: ReflectionContext, rng: random.Random | None = None) -> str:
        """The teacher's reflection for one decision point (``rng`` is unused: the endpoint decides)."""
        return self.reflect_many([ctx], rng)[0]

    def reflect_many(
        self, contexts: Sequence[ReflectionContext], rng: random.Random | None = None
    ) -> list[str]:
        """Reflections for many decision points, in input order.

        Cached requests make no call; the others run at most ``max_concurrency`` at a time (identical
        requests only once). If one fails, the requests not yet started are cancelled and the error is
        raised once the running ones are done; the reflections that did arrive are cached, so a re-run
        resumes where this one stopped.
        """
        payloads = [self.payload(ctx) for ctx in contexts]
        keys = [request_key(p) for p in payloads]
        texts: dict[str, str] = {}
        missing: dict[str, dict[str, Any]] = {}
        for key, payload in zip(keys, payloads, strict=True):
            if key in texts or key in missing:
                continue
            cached = self._cache_get(key)
            if cached is None:
                missing[key] = payload
            else:
                texts[key] = cached
                with self._lock:
                    self._cache_hits += 1
        if len(missing) == 1:
            ((key, payload),) = missing.items()
            texts[key] = self._complete(key, payload)
        elif missing:
            with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(missing))) as pool:
                futures = {key: pool.submit(self._complete, key, payload) for key, payload in missing.items()}
                try:
                    for key, future in futures.items():
                        texts[key] = future.result()
                except BaseException:
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
        return [postprocess(texts[key]) for key in keys]

    # -- requests ---------------------------------------------------------------------------------------

    def payload(self, ctx: ReflectionContext) -> dict[str, Any]:
        """The chat-completions request body for a decision point (also the cache key's content)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": build_messages(ctx),
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        if self.top_p is not None:
            body["top_p"] = self.top_p
        if self.request_seed is not None:
            body["seed"] = self.request_seed
        body.update(self.extra_body)
        return body

    def _complete(self, key: str, payload: dict[str, Any]) -> str:
        response = self.endpoint.post(payload)
        text = self._content_of(response)
        self._cache_put(key, payload, text)
        return text

    def _content_of(self, response: Mapping[str, Any]) -> str:
        try:
            content = response["choices"][0]["message"].get("content")
        except (KeyError, IndexError, TypeError, AttributeError) as err:
            raise TeacherRequestError(
                f"teacher endpoint {self.url} answered without choices[0].message: {json.dumps(response)[:300]}"
            ) from err
        if content is None:
            return ""
        if not isinstance(content, str):
            raise TeacherRequestError(
                f"teacher endpoint {self.url} answered with non-text content {content!r:.200}"
            )
        return content

    # -- cache ------------------------------------------------------------------------------------------

    def _cache_path(self, key: str) -> Path | None:
        return None if self.cache_dir is None else self.cache_dir / key[:2] / f"{key}.json"

    def _cache_get(self, key: str) -> str | None:
        path = self._cache_path(key)
        if path is None or not path.is_file():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))["content"]
        except (ValueError, KeyError, TypeError) as err:
            logger.warning("ignoring unreadable teacher cache entry %s (%s)", path, err)
            return None

    def _cache_put(self, key: str, payload: Mapping[str, Any], content: str) -> None:
        path = self._cache_path(key)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"key": key, "request": payload, "content": content, "created": time.time()}
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(record, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)


__all__ = [
    "RETRYABLE_STATUSES",
    "SYSTEM_PROMPT",
    "TeacherError",
    "TeacherReflector",
    "TeacherRequestError",
    "TeacherUnavailableError",
    "build_messages",
    "postprocess",
    "request_key",
]
