"""Real OpenAI-compatible chat servers on 127.0.0.1 for the teacher reflector's tests.

* :class:`ChatCompletionsServer` — a stdlib ``http.server`` serving ``POST /v1/chat/completions`` over real
  sockets. Its answers come from a ``generate(body) -> str`` callable (:class:`TinyChatModel` runs
  ``model.generate`` on a tiny local model). It counts requests and the peak number in flight, and can be
  told to fail its first requests with given HTTP statuses.
* :func:`transformers_serve` — ``transformers serve`` in a subprocess on a free port, with the POSTs it
  handled counted from its access log.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
#: A minimal chat template for the tiny tokenizers (they ship without one).
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def add_chat_template(model_dir: Path) -> None:
    """Give a saved tiny tokenizer a chat template (servers need one for chat completions)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(model_dir)


class TinyChatModel:
    """Chat completions by ``model.generate`` on a local causal LM (seeded per request, thread-safe)."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        self.context = int(
            getattr(self.model.config, "n_positions", 0) or self.model.config.max_position_embeddings
        )
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> str:
        import torch

        prompt = self.tokenizer.apply_chat_template(
            body["messages"], tokenize=False, add_generation_prompt=True
        )
        max_new = int(body.get("max_tokens") or 16)
        ids = self.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        ids = ids[:, -(self.context - max_new) :]
        temperature = float(body.get("temperature", 1.0))
        # Same request -> same answer; different prompts -> (almost surely) different answers.
        seed = int(hashlib.sha256(f"{body.get('seed', 0)}|{prompt}".encode()).hexdigest()[:8], 16)
        special = [[i] for i in self.tokenizer.all_special_ids]
        with self._lock, torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new,
                min_new_tokens=max_new,
                do_sample=temperature > 0,
                temperature=temperature if temperature > 0 else None,
                top_k=None,
                top_p=None,
                bad_words_ids=special,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        return self.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


@dataclass
class ServerLog:
    """What the stdlib server saw (guarded by ``lock``)."""

    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class ChatCompletionsServer(ThreadingHTTPServer):
    """An OpenAI-compatible ``/v1/chat/completions`` server on 127.0.0.1 (a real socket, one thread a request).

    ``fail_statuses``: the first requests are answered with these HTTP statuses, in order. ``delay``: each
    request waits a seeded random time in this range (seconds) before answering, so requests overlap and
    finish out of order.
    """

    # Handler threads are joined on close, so none is still inside torch when the interpreter exits.
    daemon_threads = False
    block_on_close = True

    def __init__(
        self,
        generate: Callable[[dict[str, Any]], str],
        *,
        fail_statuses: Sequence[int] = (),
        delay: tuple[float, float] = (0.0, 0.0),
        seed: int = 0,
    ) -> None:
        super().__init__((LOOPBACK, 0), _ChatHandler)
        self.generate = generate
        self.fail_statuses = list(fail_statuses)
        self.delay = delay
        self.rng = random.Random(seed)
        self.log = ServerLog()
        self.stopping = threading.Event()  # cuts the delays short at shutdown

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that gave up (timeouts) are expected here; anything else is reported."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.server_address[1]}/v1"


class _ChatHandler(BaseHTTPRequestHandler):
    server: ChatCompletionsServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # keep the test output quiet
        pass

    def _send_json(self, status: int, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send_json(200, {"status": "ok"})
        else:
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path != "/v1/chat/completions":
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})
            return
        log = self.server.log
        with log.lock:
            log.requests += 1
            log.in_flight += 1
            log.max_in_flight = max(log.max_in_flight, log.in_flight)
        try:
            status, answer = self._answer(raw)
        finally:
            # Leave the in-flight count *before* answering: once the client has the answer it may send its
            # next request, and that one must not be counted as overlapping with this one.
            with log.lock:
                log.in_flight -= 1
        self._send_json(status, answer)

    def _answer(self, raw: bytes) -> tuple[int, dict[str, Any]]:
        srv, log = self.server, self.server.log
        try:
            body = json.loads(raw)
        except ValueError:
            return 400, {"error": {"message": "body is not JSON"}}
        with log.lock:
            log.bodies.append(body)
            log.headers.append(dict(self.headers.items()))
            fail = srv.fail_statuses.pop(0) if srv.fail_statuses else None
            delay = srv.rng.uniform(*srv.delay)
        if fail is not None:
            return fail, {"error": {"message": f"scripted failure {fail}"}}
        srv.stopping.wait(delay)
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": srv.generate(body)},
            "finish_reason": "length",
        }
        return 200, {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": [choice],
        }


@contextmanager
def running(server: ChatCompletionsServer) -> Iterator[ChatCompletionsServer]:
    """Serve in a background thread; always shut down and close the socket afterwards."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stopping.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class TransformersServe:
    """A running ``transformers serve`` subprocess; ``posts()`` counts chat POSTs in its access log."""

    def __init__(self, process: subprocess.Popen, port: int) -> None:
        self.process = process
        self.port = port
        self.base_url = f"http://{LOOPBACK}:{port}/v1"
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def log_text(self) -> str:
        with self._lock:
            return "\n".join(self.lines)

    def posts(self) -> int:
        with self._lock:
            return sum('"POST /v1/chat/completions HTTP/1.1" 200' in line for line in self.lines)

    def health_checks(self) -> int:
        with self._lock:
            return sum('"GET /health HTTP/1.1" 200' in line for line in self.lines)

    def ping(self, timeout: float = 2.0) -> bool:
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{self.port}/health", timeout=timeout) as response:
                return response.status == 200
        except OSError:
            return False

    def settle(self, timeout: float = 10.0) -> None:
        """Send a /health sentinel and wait until its access-log line is in: every earlier request is logged."""
        before = self.health_checks()
        assert self.ping(), "transformers serve stopped answering /health"
        deadline = time.monotonic() + timeout
        while self.health_checks() <= before:
            assert time.monotonic() < deadline, (
                f"access log never showed the sentinel:\n{self.log_text()[-2000:]}"
            )
            time.sleep(0.02)


@contextmanager
def transformers_serve(model_dir: Path, start_timeout: float = 90.0) -> Iterator[TransformersServe]:
    """Start ``transformers serve <model_dir>`` on 127.0.0.1:<free port> (CPU, offline); always stop it."""
    port = free_port()
    cli = Path(sys.executable).with_name("transformers")
    command = [str(cli)] if cli.exists() else [sys.executable, "-m", "transformers.cli.transformers"]
    command += [
        "serve",
        str(model_dir),
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--device",
        "cpu",
        "--log-level",
        "info",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"}
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    server = TransformersServe(process, port)
    try:
        deadline = time.monotonic() + start_timeout
        while not server.ping(timeout=1.0):
            if process.poll() is not None:
                raise RuntimeError(
                    f"transformers serve exited with {process.returncode}:\n{server.log_text()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"transformers serve not up after {start_timeout}s:\n{server.log_text()}")
            time.sleep(0.1)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
