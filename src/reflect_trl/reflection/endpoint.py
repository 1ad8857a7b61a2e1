"""One OpenAI-compatible HTTP endpoint: a JSON ``POST`` with a timeout, bounded retries and jittered backoff.

Shared by the two clients of OpenAI-compatible servers: the teacher reflector (``/chat/completions``, data
generation, :mod:`reflect_trl.reflection.teacher`) and the served reflection player (``/completions``,
rollouts, :mod:`reflect_trl.reflection.remote`). Only the standard library is used.

What is retried: connection errors, timeouts, HTTP 408/409/429 and 5xx (``Retry-After`` is honoured up to
``backoff_max``), and, when the caller asks for it, answers that are not JSON or that the caller's ``parse``
rejects with :class:`MalformedResponse`. Other 4xx answers are not retried. Every attempt has a socket
timeout; a :class:`Deadline` bounds a whole call (all attempts and backoffs) and can be cancelled from
another thread. Loopback servers are never reached through an HTTP proxy from the environment. The API key is
read from a named environment variable at request time and never stored.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import logging
import os
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

#: HTTP statuses worth retrying besides 5xx: the server is up but busy or failing transiently.
RETRYABLE_STATUSES = frozenset({408, 409, 429})

T = TypeVar("T")


class MalformedResponse(ValueError):
    """The endpoint answered, but with something unusable (not JSON, or rejected by the caller's ``parse``).

    The message completes the sentence "<what> endpoint <url> ..." (e.g. "answered with non-JSON: ...")."""


class Deadline:
    """A time limit for one call (all its requests, attempts and backoffs), cancellable from any thread."""

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)
        self.at = time.monotonic() + self.seconds
        self._cancelled = threading.Event()

    def remaining(self) -> float:
        """Seconds left (0 once cancelled or expired)."""
        return 0.0 if self._cancelled.is_set() else max(0.0, self.at - time.monotonic())

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def sleep(self, seconds: float) -> None:
        """Sleep, waking early when cancelled."""
        self._cancelled.wait(max(0.0, seconds))


def is_loopback(host: str | None) -> bool:
    """True for ``localhost`` and loopback IP addresses."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class OpenAIEndpoint:
    """``POST {base_url}{route}`` with JSON in and out, retried as described in the module docstring.

    ``what`` names the client in errors and logs ("teacher", "reflection server"). Errors are raised as
    ``unavailable_error`` (unreachable or still failing after all retries, or the deadline passed) and
    ``request_error`` (a non-retryable 4xx, or an unusable answer when ``retry_malformed`` is False); both
    classes take one message argument. ``max_concurrency`` (optional) bounds the requests in flight across
    all threads that share this endpoint. ``seed`` seeds the backoff jitter.
    """

    def __init__(
        self,
        base_url: str,
        route: str,
        model: str,
        *,
        what: str,
        api_key_env: str | None,
        timeout: float,
        max_retries: int,
        backoff_base: float,
        backoff_max: float,
        max_concurrency: int | None = None,
        seed: int = 0,
        retry_malformed: bool = False,
        unavailable_error: type[Exception] = RuntimeError,
        request_error: type[Exception] = RuntimeError,
    ) -> None:
        parsed = urllib.parse.urlparse(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(
                f"{what} base_url {base_url!r} must be an http(s) URL such as http://127.0.0.1:8000/v1"
            )
        if not model:
            raise ValueError(f"{what} model name must be non-empty")
        if timeout <= 0:
            raise ValueError(f"{what} timeout must be > 0 seconds, got {timeout}")
        if max_retries < 0:
            raise ValueError(f"{what} max_retries must be >= 0, got {max_retries}")
        if backoff_base < 0 or backoff_max < 0:
            raise ValueError(
                f"{what} backoff_base/backoff_max must be >= 0, got {backoff_base}/{backoff_max}"
            )
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"{what} max_concurrency must be >= 1, got {max_concurrency}")
        self.what = what
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/{route.lstrip('/')}"
        self.model = model
        self.api_key_env = api_key_env
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.retry_malformed = retry_malformed
        self.unavailable_error = unavailable_error
        self.request_error = request_error
        self.stats = {"requests": 0, "retries": 0}
        self._jitter_rng = random.Random(seed)
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_concurrency) if max_concurrency else None
        handlers = [urllib.request.ProxyHandler({})] if is_loopback(parsed.hostname) else []
        self._opener = urllib.request.build_opener(*handlers)

    def headers(self) -> dict[str, str]:
        """Request headers; ``Authorization`` only when the API-key variable is set and non-empty."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        api_key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        return headers

    def post(
        self,
        payload: Mapping[str, Any],
        parse: Callable[[dict[str, Any]], T] | None = None,
        deadline: Deadline | None = None,
    ) -> T | dict[str, Any]:
        """POST ``payload``; return ``parse(answer)`` (the answer itself without ``parse``)."""
        data = json.dumps(payload).encode("utf-8")
        headers = self.headers()
        attempts = self.max_retries + 1
        last_error, tried = "", 0
        for attempt in range(attempts):
            timeout = self.timeout if deadline is None else min(self.timeout, deadline.remaining())
            if timeout <= 0:
                break
            retry_after: float | None = None
            try:
                tried += 1
                body = self._send(data, headers, timeout, deadline)
                answer = self._parse_json(body)
                return parse(answer) if parse is not None else answer
            except urllib.error.HTTPError as err:
                detail = error_body(err)
                if err.code not in RETRYABLE_STATUSES and err.code < 500:
                    raise self.request_error(self._rejection_message(err.code, detail)) from err
                last_error = f"HTTP {err.code}: {detail}"
                retry_after = retry_after_seconds(err)
            except MalformedResponse as err:
                if not self.retry_malformed:
                    raise self.request_error(f"{self.what} endpoint {self.url} {err}") from err
                last_error = f"malformed answer: {err}"
            except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
                reason = getattr(err, "reason", err)
                last_error = f"{type(reason).__name__}: {reason}"
            if attempt + 1 < attempts:
                delay = self._backoff(attempt, retry_after)
                if deadline is not None and delay >= deadline.remaining():
                    break
                logger.warning(
                    "%s request to %s failed (%s); retry %d/%d in %.2fs",
                    self.what,
                    self.url,
                    last_error,
                    attempt + 1,
                    self.max_retries,
                    delay,
                )
                with self._lock:
                    self.stats["retries"] += 1
                if deadline is None:
                    time.sleep(delay)
                else:
                    deadline.sleep(delay)
        raise self.unavailable_error(self._unavailable_message(tried, last_error, deadline))

    def _send(self, data: bytes, headers: dict[str, str], timeout: float, deadline: Deadline | None) -> bytes:
        if self._slots is not None and not self._slots.acquire(
            timeout=None if deadline is None else deadline.remaining()
        ):
            raise TimeoutError("no free request slot before the deadline")
        try:
            with self._lock:
                self.stats["requests"] += 1
            request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            with self._opener.open(request, timeout=timeout) as response:
                return response.read()
        finally:
            if self._slots is not None:
                self._slots.release()

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        with self._lock:
            jitter = self._jitter_rng.random()
        delay = min(self.backoff_max, self.backoff_base * (2**attempt)) * (0.5 + jitter)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.backoff_max))
        return delay

    def _unavailable_message(self, tried: int, last_error: str, deadline: Deadline | None) -> str:
        head = f"{self.what} endpoint {self.base_url} (POST {self.url}, model {self.model!r})"
        settings = f"max_retries={self.max_retries}, timeout={self.timeout}s"
        if deadline is not None and deadline.remaining() <= 0:
            why = "was cancelled" if deadline.cancelled else f"ran out of its {deadline.seconds:g}s deadline"
            return f"{head} {why} after {tried} attempt(s) ({settings}); last error: {last_error or 'none'}."
        return (
            f"{head} failed after {tried} attempt(s) ({settings}); last error: {last_error}. "
            "Check that the server is running and reachable, or raise max_retries/timeout."
        )

    def _rejection_message(self, status: int, detail: str) -> str:
        hint = ""
        if status in (401, 403):
            hint = f" Is the API key in ${self.api_key_env} set and valid?"
        elif status == 404:
            hint = (
                f" Is base_url right (it should end in /v1) and does the server serve model {self.model!r}?"
            )
        return f"{self.what} endpoint {self.url} rejected the request with HTTP {status}: {detail}.{hint}"

    @staticmethod
    def _parse_json(body: bytes) -> dict[str, Any]:
        try:
            parsed = json.loads(body)
        except ValueError as err:
            raise MalformedResponse(f"answered with non-JSON: {body[:200]!r}") from err
        if not isinstance(parsed, dict):
            raise MalformedResponse(f"answered with {type(parsed).__name__}, not an object")
        return parsed


def error_body(err: urllib.error.HTTPError) -> str:
    """The first 300 characters of an HTTP error's body, on one line (its reason when empty)."""
    try:
        text = err.read().decode("utf-8", "replace")
    except OSError:
        text = ""
    return " ".join(text.split())[:300] or str(err.reason)


def retry_after_seconds(err: urllib.error.HTTPError) -> float | None:
    """The ``Retry-After`` header in seconds, when it is a number."""
    value = err.headers.get("Retry-After") if err.headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


__all__ = [
    "RETRYABLE_STATUSES",
    "Deadline",
    "MalformedResponse",
    "OpenAIEndpoint",
    "error_body",
    "is_loopback",
    "retry_after_seconds",
]
