"""Real OpenAI-compatible servers on 127.0.0.1 for the tests of the HTTP clients (teacher, served reflection player).

* :class:`OpenAIServer` — a stdlib ``http.server`` serving one ``POST`` route over real sockets, one thread per
  request. Subclasses say what a successful answer is (:meth:`OpenAIServer.answer`). It counts requests and the
  peak number in flight, and injects scripted faults into its first requests (see :data:`FAULTS`).
* :func:`transformers_serve` — ``transformers serve`` in a subprocess on a free port, with the POSTs it handled
  counted from its access log.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from reflect_trl.reflection.serve import LOOPBACK, free_port, serve_command, serve_env, stop_server

#: Scripted faults besides an HTTP status (an int): what the server does instead of answering normally.
FAULTS = {
    "not-json": "answer 200 with an HTML page",
    "drop": "close the connection without answering",
    "stall": "answer only after `stall` seconds (cut short at shutdown)",
    "extra-choice": "answer 200 with one choice too many",
    "no-choices": "answer 200 with an object that has no choices",
}


@dataclass
class ServerLog:
    """What the stdlib server saw (guarded by ``lock``)."""

    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class OpenAIServer(ThreadingHTTPServer):
    """An OpenAI-compatible server of the route ``route`` on 127.0.0.1 (a real socket, one thread a request).

    ``faults``: the first requests get these faults, in order (an int is an HTTP status; strings: :data:`FAULTS`).
    ``delay``: each request waits a seeded random time in this range (seconds) before answering, so requests
    overlap and finish out of order. ``stall``: how long a ``"stall"`` fault waits. ``port``: 0 = a free one.
    """

    route = ""
    # Room for many concurrent connections: with socketserver's default backlog of 5, the connections beyond it
    # wait for a TCP SYN retransmission (1 s) or are reset.
    request_queue_size = 256
    # Handler threads are joined on close, so none is still inside torch when the interpreter exits.
    daemon_threads = False
    block_on_close = True

    def __init__(
        self,
        *,
        faults: Sequence[int | str] = (),
        delay: tuple[float, float] = (0.0, 0.0),
        stall: float = 30.0,
        seed: int = 0,
        port: int = 0,
    ) -> None:
        unknown = [f for f in faults if not isinstance(f, int) and f not in FAULTS]
        if unknown:
            raise ValueError(f"unknown fault(s) {unknown}; known: {sorted(FAULTS)} or an HTTP status")
        super().__init__((LOOPBACK, port), _Handler)
        self.faults = list(faults)
        self.delay = delay
        self.stall = stall
        self.rng = random.Random(seed)
        self.log = ServerLog()
        self.stopping = threading.Event()  # cuts the delays short at shutdown

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """The 200 answer to a well-formed request body."""
        raise NotImplementedError

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that gave up (timeouts) are expected here; anything else is reported."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.server_address[1]}/v1"


class _Handler(BaseHTTPRequestHandler):
    server: OpenAIServer
    protocol_version = "HTTP/1.1"
    # The headers and the body go out in two writes: without TCP_NODELAY, Nagle's algorithm and the client's
    # delayed ACK hold the body back for ~40 ms.
    disable_nagle_algorithm = True

    def log_message(self, *args: Any) -> None:  # keep the test output quiet
        pass

    def _send(self, status: int, data: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_json(self, status: int, obj: dict[str, Any]) -> None:
        self._send(status, json.dumps(obj).encode())

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send_json(200, {"status": "ok"})
        else:
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path != self.server.route:
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})
            return
        log = self.server.log
        with log.lock:
            log.requests += 1
            log.in_flight += 1
            log.max_in_flight = max(log.max_in_flight, log.in_flight)
        try:
            reply = self._reply(raw)
        finally:
            # Leave the in-flight count *before* answering: once the client has the answer it may send its
            # next request, and that one must not be counted as overlapping with this one.
            with log.lock:
                log.in_flight -= 1
        if reply is None:  # "drop"
            self.close_connection = True
            return
        status, data, content_type = reply
        self._send(status, data, content_type)

    def _reply(self, raw: bytes) -> tuple[int, bytes, str] | None:
        srv, log = self.server, self.server.log
        try:
            body = json.loads(raw)
        except ValueError:
            return 400, json.dumps({"error": {"message": "body is not JSON"}}).encode(), "application/json"
        with log.lock:
            log.bodies.append(body)
            log.headers.append(dict(self.headers.items()))
            fault = srv.faults.pop(0) if srv.faults else None
            delay = srv.rng.uniform(*srv.delay)
        if isinstance(fault, int):
            return (
                fault,
                json.dumps({"error": {"message": f"scripted failure {fault}"}}).encode(),
                "application/json",
            )
        if fault == "drop":
            return None
        if fault == "not-json":
            return 200, b"<html><body>502 Bad Gateway</body></html>", "text/html"
        if fault == "no-choices":
            return (
                200,
                json.dumps({"object": "text_completion", "model": body.get("model")}).encode(),
                "application/json",
            )
        srv.stopping.wait(srv.stall if fault == "stall" else delay)
        answer = srv.answer(body)
        if fault == "extra-choice":
            answer["choices"] = answer["choices"] + answer["choices"][:1]
        return 200, json.dumps(answer).encode(), "application/json"


@contextmanager
def running(server: OpenAIServer) -> Iterator[OpenAIServer]:
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
    """A running ``transformers serve`` subprocess; ``posts(route)`` counts the POSTs in its access log."""

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

    def posts(self, route: str = "/v1/chat/completions") -> int:
        with self._lock:
            return sum(f'"POST {route} HTTP/1.1" 200' in line for line in self.lines)

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
def transformers_serve(
    model_dir: Path, start_timeout: float = 90.0, extra_args: Sequence[str] = ()
) -> Iterator[TransformersServe]:
    """Start ``transformers serve <model_dir>`` on 127.0.0.1:<free port> (CPU, offline); always stop it."""
    port = free_port()
    process = subprocess.Popen(
        serve_command(port, str(model_dir), "cpu", extra_args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=serve_env(),
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
        stop_server(process, timeout=10)
