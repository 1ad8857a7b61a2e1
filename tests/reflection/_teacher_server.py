"""Real OpenAI-compatible chat servers on 127.0.0.1 for the teacher reflector's tests.

* :class:`ChatCompletionsServer` — the stdlib :class:`~_openai_server.OpenAIServer` serving
  ``POST /v1/chat/completions``. Its answers come from a ``generate(body) -> str`` callable (:class:`TinyChatModel`
  runs ``model.generate`` on a tiny local model). It counts requests and the peak number in flight, and can be
  told to fail its first requests with given HTTP statuses.
* :func:`transformers_serve` — ``transformers serve`` in a subprocess on a free port, with the POSTs it
  handled counted from its access log (from :mod:`_openai_server`).
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _openai_server import (
    LOOPBACK,
    OpenAIServer,
    ServerLog,
    TransformersServe,
    free_port,
    running,
    transformers_serve,
)

#: A minimal chat template for the tiny tokenizers (they ship without one).
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


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


class ChatCompletionsServer(OpenAIServer):
    """An OpenAI-compatible ``/v1/chat/completions`` server on 127.0.0.1 (a real socket, one thread a request).

    ``fail_statuses``: the first requests are answered with these HTTP statuses, in order. ``delay``: each
    request waits a seeded random time in this range (seconds) before answering, so requests overlap and
    finish out of order.
    """

    route = "/v1/chat/completions"

    def __init__(
        self,
        generate: Callable[[dict[str, Any]], str],
        *,
        fail_statuses: Sequence[int] = (),
        delay: tuple[float, float] = (0.0, 0.0),
        seed: int = 0,
    ) -> None:
        super().__init__(faults=fail_statuses, delay=delay, seed=seed)
        self.generate = generate

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": self.generate(body)},
            "finish_reason": "length",
        }
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": [choice],
        }


__all__ = [
    "CHAT_TEMPLATE",
    "LOOPBACK",
    "ChatCompletionsServer",
    "ServerLog",
    "TinyChatModel",
    "TransformersServe",
    "add_chat_template",
    "free_port",
    "running",
    "transformers_serve",
]
