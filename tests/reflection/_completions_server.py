"""Real OpenAI-compatible *completions* servers on 127.0.0.1 for the served reflection player's tests and benchmark.

* :class:`CompletionsServer` — the stdlib :class:`~_openai_server.OpenAIServer` serving ``POST /v1/completions``
  (string, token-id and list prompts, as vLLM does), with the fault injection of :mod:`_openai_server`. Its choices
  come from a ``complete(body) -> list[Choice]`` callable:
* :class:`HFCompletions` — one ``model.generate`` per prompt on a local causal LM with vLLM's semantics: generation
  stops at a ``stop`` string or EOS, the returned text excludes the stop string, ``finish_reason`` is ``"stop"`` or
  ``"length"``, ``usage.completion_tokens`` counts the generated tokens (the stop token included);
* :class:`BatchedCompletions` — what a batching engine does: the prompts of concurrent requests are collected for a
  short window and generated together by one :class:`~reflect_trl.reflection.model.ReflectionModel` call (the
  benchmark's stand-in for vLLM on a CPU-only machine);
* :func:`scripted` — canned choices (per prompt text).

``python tests/reflection/_completions_server.py MODEL_DIR --port N [--batched]`` serves a model from a subprocess.
"""

from __future__ import annotations

import argparse
import hashlib
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _openai_server import LOOPBACK, OpenAIServer


@dataclass
class Choice:
    text: str
    finish_reason: str  # "stop" | "length"
    tokens: int


def prompts_of(body: dict[str, Any]) -> list[str | list[int]]:
    """The request's prompts: a string, a list of token ids, or a list of either (as vLLM reads ``prompt``)."""
    prompt = body["prompt"]
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        return list(prompt)
    raise ValueError(f"unsupported prompt {prompt!r:.100}")


class CompletionsServer(OpenAIServer):
    """``/v1/completions`` on 127.0.0.1; ``shuffle_choices`` returns the choices of a list prompt in reverse order
    (with their ``index``), as the API allows."""

    route = "/v1/completions"

    def __init__(
        self,
        complete: Callable[[dict[str, Any]], list[Choice]],
        *,
        shuffle_choices: bool = False,
        faults: Sequence[int | str] = (),
        delay: tuple[float, float] = (0.0, 0.0),
        stall: float = 30.0,
        seed: int = 0,
        port: int = 0,
    ) -> None:
        super().__init__(faults=faults, delay=delay, stall=stall, seed=seed, port=port)
        self.complete = complete
        self.shuffle_choices = shuffle_choices

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        results = self.complete(body)
        choices = [
            {"index": i, "text": c.text, "finish_reason": c.finish_reason, "logprobs": None}
            for i, c in enumerate(results)
        ]
        if self.shuffle_choices:
            choices.reverse()
        tokens = sum(c.tokens for c in results)
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:12]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": choices,
            "usage": {"prompt_tokens": 0, "completion_tokens": tokens, "total_tokens": tokens},
        }


def scripted(answers: Choice | Mapping[str, Choice]) -> Callable[[dict[str, Any]], list[Choice]]:
    """Canned choices: the same for every prompt, or looked up by the prompt text."""

    def complete(body: dict[str, Any]) -> list[Choice]:
        if isinstance(answers, Choice):
            return [answers for _ in prompts_of(body)]
        return [answers[str(p)] for p in prompts_of(body)]

    return complete


class HFCompletions:
    """Completions by ``model.generate`` at batch size 1 on a local causal LM (vLLM's semantics, thread-safe)."""

    def __init__(self, model_dir: str | Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> list[Choice]:
        return [self.one(prompt, body) for prompt in prompts_of(body)]

    def one(self, prompt: str | list[int], body: dict[str, Any]) -> Choice:
        import torch

        tok = self.tokenizer
        ids = tok(prompt)["input_ids"] if isinstance(prompt, str) else list(prompt)
        stops = list(body.get("stop") or [])
        eos = [tok.eos_token_id]
        for s in stops:  # single-token stop strings end generation like EOS (others: stop_strings)
            s_ids = tok(s, add_special_tokens=False)["input_ids"]
            if len(s_ids) == 1:
                eos.append(s_ids[0])
        temperature = float(body.get("temperature", 1.0))
        sampling = (
            dict(do_sample=True, temperature=temperature, top_p=float(body.get("top_p", 1.0)), top_k=0)
            if temperature > 0
            else dict(do_sample=False)
        )
        seed = int(hashlib.sha256(f"{body.get('seed')}|{ids}".encode()).hexdigest()[:8], 16)
        input_ids = torch.tensor([ids])
        with self._lock, torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            out = self.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=int(body.get("max_tokens") or 16),
                eos_token_id=eos,
                pad_token_id=tok.pad_token_id,
                stop_strings=stops or None,
                tokenizer=tok if stops else None,
                **sampling,
            )
        new = out[0, len(ids) :].tolist()
        raw = tok.decode(new, skip_special_tokens=False)
        cut = min((raw.index(s) for s in stops if s in raw), default=None)
        stopped = cut is not None or (bool(new) and new[-1] in eos)
        text = raw if cut is None else raw[:cut]
        text = text.replace(tok.eos_token, "") if tok.eos_token else text
        return Choice(text, "stop" if stopped else "length", len(new))


class BatchedCompletions:
    """Generates the prompts of concurrent requests together: requests queue their prompts, a worker waits until
    no new prompt arrived for ``window`` seconds (or ``max_batch`` are queued) and runs one ``ReflectionModel``
    call per group of equal sampling settings (text and token-id prompts in separate calls)."""

    def __init__(self, model_dir: str | Path, window: float = 0.01, max_batch: int = 256) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from reflect_trl.reflection.model import ReflectionModel

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        self.reflection = ReflectionModel(model, tokenizer)
        self.window = window
        self.max_batch = max_batch
        self.batches: list[int] = []  # sizes of the generate calls made
        self._queue: queue.Queue = queue.Queue()
        self._worker = threading.Thread(target=self._run, daemon=True)
        self._worker.start()

    def __call__(self, body: dict[str, Any]) -> list[Choice]:
        key = (
            int(body.get("max_tokens") or 16),
            float(body.get("temperature", 1.0)),
            float(body.get("top_p", 1.0)),
        )
        futures = []
        for prompt in prompts_of(body):
            future: Future = Future()
            self._queue.put((key, prompt, future))
            futures.append(future)
        return [f.result() for f in futures]

    def _run(self) -> None:
        while True:
            items = [self._queue.get()]
            while len(items) < self.max_batch:
                try:
                    items.append(self._queue.get(timeout=self.window))
                except queue.Empty:
                    break
            groups: dict[tuple, list] = {}
            for key, prompt, future in items:
                groups.setdefault((key, isinstance(prompt, str)), []).append((prompt, future))
            for ((max_tokens, temperature, top_p), is_text), group in groups.items():
                self._generate(group, max_tokens, temperature, top_p, is_text)

    def _generate(
        self, group: list, max_tokens: int, temperature: float, top_p: float, is_text: bool
    ) -> None:
        model = self.reflection
        model.max_new_tokens, model.temperature, model.top_p = max_tokens, temperature, top_p
        prompts = [p for p, _ in group]
        try:
            if is_text:
                batch = model.generate(prompts)
            else:
                batch = model.generate([""] * len(prompts), prompt_ids=prompts)
        except Exception as err:  # handed to the waiting request threads
            for _, future in group:
                future.set_exception(err)
            return
        self.batches.append(len(group))
        for (_, future), text, n, stopped in zip(
            group, batch.texts, batch.num_tokens, batch.stopped, strict=True
        ):
            future.set_result(Choice(text, "stop" if stopped else "length", n))


def main(argv: Sequence[str] | None = None) -> None:
    """Serve ``MODEL_DIR`` on 127.0.0.1:PORT until killed (prints ``ready <base_url>`` once listening)."""
    import torch

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("model_dir")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--batched", action="store_true", help="batch concurrent requests (BatchedCompletions)"
    )
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    complete = BatchedCompletions(args.model_dir) if args.batched else HFCompletions(args.model_dir)
    server = CompletionsServer(complete, port=args.port)
    print(f"ready http://{LOOPBACK}:{args.port}/v1", flush=True)
    server.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    main()
