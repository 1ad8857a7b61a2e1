"""The frozen reflection player behind an OpenAI-compatible inference server (vLLM, SGLang, TGI, ``transformers
serve``): a drop-in for :class:`~reflect_trl.reflection.model.ReflectionModel` in rollouts.

The reflection model is a plain causal LM trained on raw text, so the client uses the **completions** endpoint
(``POST {base_url}/completions``), not chat: the prompt is exactly the in-process model's prompt text, generation
stops at :data:`~reflect_trl.prompts.STOP_MARKER` (``stop``) or the server's EOS, and ``max_tokens``,
``temperature`` and ``top_p`` are the in-process model's budget and sampling settings.

One request per prompt (``prompts_per_request=1``, the default) is sent concurrently from a bounded thread pool:
every OpenAI-compatible server takes a single string prompt (``transformers serve`` accepts nothing else), the
server's continuous batching batches the concurrent requests, and the per-request ``usage`` gives each
reflection's exact token count. ``prompts_per_request > 1`` sends lists of prompts in one request (the OpenAI
API allows it; vLLM, SGLang and OpenAI accept it), which saves HTTP round trips on a large batch.

Failures (connection refused, timeouts, HTTP 5xx/429, answers that are not JSON or carry the wrong number of
choices) are retried with jittered exponential backoff; a whole :meth:`RemoteReflectionModel.generate` call has a
deadline; what still fails raises :class:`ReflectionServerError`, naming the URL and the last error. A reflection
without the stop marker is not an error: it used up its budget (``stopped=False``), as in-process.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from reflect_trl.prompts import STOP_MARKER, clean_reflection, encode_prompts
from reflect_trl.reflection.endpoint import Deadline, MalformedResponse, OpenAIEndpoint
from reflect_trl.reflection.model import ReflectionBatch

logger = logging.getLogger(__name__)

#: The environment variable that holds the reflection server's API key (unset: no ``Authorization`` header).
DEFAULT_API_KEY_ENV = "REFLECT_TRL_REFLECTION_API_KEY"
#: Extra seconds the caller waits for its worker threads beyond the call's deadline.
_DEADLINE_GRACE_S = 1.0


class ReflectionServerError(RuntimeError):
    """The reflection server failed: unreachable, still failing after all retries, past the call's deadline,
    rejected the request (a non-retryable 4xx), or kept answering with something unusable.

    ``url`` is the endpoint. Catch this in a trainer to write a checkpoint before the run ends."""

    def __init__(self, message: str, url: str | None = None) -> None:
        super().__init__(message)
        self.url = url


@dataclass
class Completion:
    """One choice of a completions answer, reduced to what a :class:`ReflectionBatch` needs."""

    text: str
    stopped: bool
    num_tokens: int | None  # None when the server did not say


def parse_completions(answer: Mapping[str, Any], expected: int) -> list[Completion]:
    """The ``expected`` choices of a completions answer, in prompt order.

    Raises :class:`MalformedResponse` for an error object, missing or non-list ``choices``, a wrong number of
    choices, a choice without string ``text``, or indices that are not ``0..expected-1``.
    """
    if "error" in answer and "choices" not in answer:
        raise MalformedResponse(f"answered with an error object: {str(answer['error'])[:300]}")
    choices = answer.get("choices")
    if not isinstance(choices, list):
        raise MalformedResponse(f"answered without a choices list: {str(answer)[:300]}")
    if len(choices) != expected:
        raise MalformedResponse(f"answered with {len(choices)} choice(s) for {expected} prompt(s)")
    if not all(isinstance(c, Mapping) and isinstance(c.get("text"), str) for c in choices):
        raise MalformedResponse(f"answered with a choice without text: {str(choices)[:300]}")
    indices = [c.get("index") for c in choices]
    if all(isinstance(i, int) for i in indices):
        if sorted(indices) != list(range(expected)):
            raise MalformedResponse(f"answered with choice indices {indices} for {expected} prompt(s)")
        choices = sorted(choices, key=lambda c: c["index"])
    usage = answer.get("usage")
    total = usage.get("completion_tokens") if isinstance(usage, Mapping) else None
    out = []
    for choice in choices:
        text, reason = choice["text"], choice.get("finish_reason")
        # "length" = budget used up; "stop" (OpenAI, vLLM, transformers serve) or a server's own name for a stop
        # (TGI: "eos_token", "stop_sequence"). A server that returns the marker itself stopped too.
        stopped = (isinstance(reason, str) and reason != "length") or STOP_MARKER in text
        token_ids = choice.get("token_ids")  # vLLM with return_token_ids
        if isinstance(token_ids, list):
            count = len(token_ids)
        elif expected == 1 and isinstance(total, int) and total >= 0:
            count = total
        else:
            count = None
        out.append(Completion(text, stopped, count))
    return out


class RemoteReflectionModel:
    """The reflection player served by an OpenAI-compatible completions endpoint.

    Same interface as :class:`~reflect_trl.reflection.model.ReflectionModel` for
    :class:`~reflect_trl.rollout.RolloutEngine`: :meth:`generate`, ``tokenizer`` and ``max_prompt_length``.

    ``base_url`` is the API root (``http://host:8000/v1``); ``model`` the served model name (vLLM:
    ``--served-model-name``, default the path or hub id it serves; ``transformers serve``: the model to load).
    The API key is read at request time from the environment variable ``api_key_env``.

    ``tokenizer`` (optional) is the reflection model's tokenizer, loaded locally. With it, ``generate`` returns the
    prompts' token ids (the rollout reuses them for the policy prompt when both players share a vocabulary),
    prompts longer than ``max_prompt_length`` are left-truncated exactly as in-process and sent as token ids, and
    token counts are available when the server gives none per choice. Without it, ``prompt_ids`` are empty lists
    and ``max_prompt_length`` cannot be used.

    ``concurrency`` bounds the requests in flight; ``timeout`` is the socket timeout of one attempt;
    ``max_retries`` retries per request; ``deadline`` bounds a whole ``generate`` call (default: enough for every
    wave of requests to use all its attempts and backoffs). ``seed`` (optional) gives every request its own
    ``seed`` field, derived from ``seed``, the call number and the prompt's position, so sampling is reproducible
    on servers that honour it and still differs between prompts and turns. ``extra_body`` adds server-specific
    fields to every request (e.g. vLLM's ``{"top_k": -1}``).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        tokenizer: Any = None,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_prompt_length: int | None = None,
        api_key_env: str | None = DEFAULT_API_KEY_ENV,
        concurrency: int = 32,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
        deadline: float | None = None,
        prompts_per_request: int = 1,
        seed: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        what = "reflection server"
        if max_new_tokens < 1:
            raise ValueError(f"{what} max_new_tokens must be >= 1, got {max_new_tokens}")
        if concurrency < 1:
            raise ValueError(f"{what} concurrency must be >= 1, got {concurrency}")
        if prompts_per_request < 1:
            raise ValueError(f"{what} prompts_per_request must be >= 1, got {prompts_per_request}")
        if deadline is not None and deadline <= 0:
            raise ValueError(f"{what} deadline must be > 0 seconds, got {deadline}")
        if max_prompt_length and tokenizer is None:
            raise ValueError(
                f"{what}: max_prompt_length={max_prompt_length} needs the reflection model's tokenizer locally "
                "(pass tokenizer=...) to truncate prompts as the in-process model does"
            )
        self.endpoint = OpenAIEndpoint(
            base_url,
            "completions",
            model,
            what=what,
            api_key_env=api_key_env,
            timeout=timeout,
            max_retries=max_retries,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            seed=0 if seed is None else seed,
            retry_malformed=True,
            unavailable_error=ReflectionServerError,
            request_error=ReflectionServerError,
        )
        self.base_url = self.endpoint.base_url
        self.url = self.endpoint.url
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.max_prompt_length = max_prompt_length
        self.concurrency = concurrency
        self.deadline = deadline
        self.prompts_per_request = prompts_per_request
        self.seed = seed
        self.extra_body = dict(extra_body or {})
        self.calls = 0
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._warned_token_counts = False

    # -- the rollout's interface -----------------------------------------------------------------------

    def tokenize(self, prompts: list[str]) -> list[list[int]]:
        """Prompt ids as the in-process model computes them (needs the local tokenizer)."""
        ids = encode_prompts(self.tokenizer, prompts)
        if self.max_prompt_length:
            ids = [x[-self.max_prompt_length :] for x in ids]
        return ids

    def generate(self, prompts: list[str], prompt_ids: list[list[int]] | None = None) -> ReflectionBatch:
        """Reflections for ``prompts``, in input order.

        ``prompt_ids`` given: those ids are sent as token-id prompts (the server must accept them, as vLLM and
        SGLang do) and returned unchanged. Otherwise the text is sent, except for prompts the local tokenizer had to
        left-truncate to ``max_prompt_length``, which go out as their truncated ids.

        Raises :class:`ReflectionServerError` when the server keeps failing (see the module docstring).
        """
        start = time.perf_counter()
        if not prompts:
            return ReflectionBatch([], [], [], [])
        wire: list[str | list[int]] = list(prompts)
        if prompt_ids is not None:
            if len(prompt_ids) != len(prompts):
                raise ValueError(f"{len(prompt_ids)} prompt_ids for {len(prompts)} prompts")
            ids = [list(x) for x in prompt_ids]
            wire = ids
        elif self.tokenizer is not None:
            full = encode_prompts(self.tokenizer, prompts)
            limit = self.max_prompt_length
            ids = [x[-limit:] for x in full] if limit else full
            wire = [i if len(i) < len(f) else p for p, i, f in zip(prompts, ids, full, strict=True)]
        else:
            ids = [[] for _ in prompts]
        call = self.calls
        self.calls += 1
        step = self.prompts_per_request
        groups = [wire[k : k + step] for k in range(0, len(wire), step)]
        payloads = [self.payload(group, self._request_seed(call, k * step)) for k, group in enumerate(groups)]
        answers = self._post_all(payloads, [len(g) for g in groups])
        completions = [c for answer in answers for c in answer]
        texts = [clean_reflection(c.text) for c in completions]
        counts = [self._token_count(c, t) for c, t in zip(completions, texts, strict=True)]
        stopped = [c.stopped for c in completions]
        return ReflectionBatch(texts, counts, stopped, ids, time.perf_counter() - start)

    # -- requests ---------------------------------------------------------------------------------------

    def payload(self, prompts: Sequence[str | list[int]], seed: int | None = None) -> dict[str, Any]:
        """The completions request body for one prompt (or a list of them)."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompts[0] if len(prompts) == 1 else list(prompts),
            "max_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stop": [STOP_MARKER],
        }
        if seed is not None:
            body["seed"] = seed
        body.update(self.extra_body)
        return body

    def _request_seed(self, call: int, position: int) -> int | None:
        if self.seed is None:
            return None
        return random.Random(f"{self.seed}/{call}/{position}").randrange(2**31)

    def call_deadline(self, num_requests: int) -> float:
        """Seconds one ``generate`` call of ``num_requests`` requests may take in all."""
        if self.deadline is not None:
            return self.deadline
        waves = math.ceil(num_requests / self.concurrency)
        ep = self.endpoint
        return waves * ((ep.max_retries + 1) * ep.timeout + ep.max_retries * ep.backoff_max)

    def _post_all(self, payloads: list[dict[str, Any]], sizes: list[int]) -> list[list[Completion]]:
        deadline = Deadline(self.call_deadline(len(payloads)))
        if len(payloads) == 1:
            return [self._post(payloads[0], sizes[0], deadline)]
        pool = self._executor()
        futures = [pool.submit(self._post, p, n, deadline) for p, n in zip(payloads, sizes, strict=True)]
        _, pending = wait(
            futures, timeout=deadline.remaining() + _DEADLINE_GRACE_S, return_when=FIRST_EXCEPTION
        )
        failed = next((f for f in futures if f.done() and not f.cancelled() and f.exception()), None)
        if failed is not None or pending:
            deadline.cancel()  # requests not yet sent are skipped, running retries stop
            for f in futures:
                f.cancel()
            if failed is not None:
                raise failed.exception()  # type: ignore[misc]
            raise ReflectionServerError(
                f"reflection server {self.url} (model {self.model!r}): {len(pending)} of {len(payloads)} requests "
                f"unanswered after the call's {deadline.seconds:g}s deadline",
                self.url,
            )
        return [f.result() for f in futures]

    def _post(self, payload: dict[str, Any], expected: int, deadline: Deadline) -> list[Completion]:
        try:
            return self.endpoint.post(payload, lambda answer: parse_completions(answer, expected), deadline)
        except ReflectionServerError as err:
            err.url = self.url
            raise

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="reflection-server")
            return self._pool

    def _token_count(self, completion: Completion, text: str) -> int:
        if completion.num_tokens is not None:
            return completion.num_tokens
        if self.tokenizer is not None:
            # Approximate: the cleaned text re-tokenized, plus the stop token, capped at the budget (decoded text
            # need not re-tokenize into the generated tokens: an untrained model's output gives more pieces).
            n = len(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + int(completion.stopped)
            return min(n, self.max_new_tokens)
        if not self._warned_token_counts:
            self._warned_token_counts = True
            logger.warning(
                "reflection server %s gives no per-choice token counts and no local tokenizer was given: "
                "reflection token counts are reported as 0",
                self.url,
            )
        return 0

    def close(self) -> None:
        """Stop the worker threads (a later ``generate`` starts new ones)."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> RemoteReflectionModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "DEFAULT_API_KEY_ENV",
    "Completion",
    "ReflectionServerError",
    "RemoteReflectionModel",
    "parse_completions",
]
