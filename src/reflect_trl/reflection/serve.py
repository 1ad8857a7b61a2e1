"""A local ``transformers serve`` for reflection models that a run trains itself (``demo`` with
``reflection_backend: openai``).

``transformers serve`` without a forced model loads the model named in each request on demand, so one server started
before the reflection models exist serves all of them by path. It is the reference OpenAI-compatible server, not a
fast one (one request at a time unless ``--continuous-batching``); for throughput, serve with vLLM / SGLang / TGI and
point ``reflect-trl rl`` / ``eval`` at it (``docs/serving.md``).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOOPBACK = "127.0.0.1"
SERVING_MODULES = ("fastapi", "uvicorn", "openai")


def check_serving_installed(what: str = "reflection_backend 'openai'") -> None:
    """Raise :class:`~reflect_trl.errors.UsageError` unless ``transformers serve``'s dependencies are installed."""
    from reflect_trl.errors import UsageError

    missing = [m for m in SERVING_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(
            f"{what} starts `transformers serve`, which needs {missing}: pip install -e '.[serve]' "
            "(or make install-extras)"
        )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/health", timeout=1.0) as response:
            return response.status == 200
    except OSError:
        return False


def serve_command(port: int, model: str | None = None, device: str = "cpu", extra_args=()) -> list[str]:
    """The ``transformers serve`` command line on 127.0.0.1:``port`` (``model`` forced, else loaded on demand)."""
    cli = Path(sys.executable).with_name("transformers")
    command = [str(cli)] if cli.exists() else [sys.executable, "-m", "transformers.cli.transformers"]
    command += ["serve", *([model] if model else []), "--host", LOOPBACK, "--port", str(port)]
    return command + ["--device", device, "--log-level", "info", *extra_args]


def serve_env() -> dict[str, str]:
    """The server's environment: offline (no hub), unbuffered, uncoloured logs."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"}


def stop_server(process: subprocess.Popen, timeout: float = 15.0) -> None:
    """Terminate the server, killing it if it does not stop within ``timeout`` seconds."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout)


@contextmanager
def local_reflection_server(
    log_path: Path, start_timeout: float = 120.0, device: str = "cpu"
) -> Iterator[str]:
    """Start ``transformers serve`` on 127.0.0.1 (a free port, offline, models loaded on demand), yield its base URL
    (``http://127.0.0.1:<port>/v1``), and always stop it. Its output goes to ``log_path``."""
    check_serving_installed()
    port = free_port()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            serve_command(port, device=device),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=serve_env(),
        )
        try:
            deadline = time.monotonic() + start_timeout
            while not _healthy(port):
                if process.poll() is not None:
                    raise RuntimeError(
                        f"transformers serve exited with status {process.returncode}; see {log_path}"
                    )
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"transformers serve not up after {start_timeout:.0f} s; see {log_path}"
                    )
                time.sleep(0.2)
            yield f"http://{LOOPBACK}:{port}/v1"
        finally:
            stop_server(process)
