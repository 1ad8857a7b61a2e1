"""The reflection player's backend, chosen by configuration: the in-process HF model or an inference server.

``make_reflection_player(backend="hf", model=..., tokenizer=...)`` returns a
:class:`~reflect_trl.reflection.model.ReflectionModel`; ``make_reflection_player(backend="openai",
base_url=..., model_name=...)`` a :class:`~reflect_trl.reflection.remote.RemoteReflectionModel`. Both satisfy
:class:`ReflectionPlayer`, the interface :class:`~reflect_trl.rollout.RolloutEngine` uses.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from reflect_trl.reflection.base import REFLECTION_BACKENDS
from reflect_trl.reflection.model import ReflectionBatch, ReflectionModel
from reflect_trl.reflection.remote import DEFAULT_API_KEY_ENV, RemoteReflectionModel


@runtime_checkable
class ReflectionPlayer(Protocol):
    """What a rollout needs from the frozen reflection player.

    ``tokenizer`` may be None (a served model without a local tokenizer): the prompt ids in the batch are then
    empty and must not be reused. ``max_prompt_length``: prompts longer than this were left-truncated."""

    tokenizer: Any
    max_prompt_length: int | None

    def generate(self, prompts: list[str], prompt_ids: list[list[int]] | None = None) -> ReflectionBatch: ...


def make_reflection_player(
    backend: str = "hf",
    *,
    model: Any = None,
    tokenizer: Any = None,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_prompt_length: int | None = None,
    base_url: str | None = None,
    model_name: str | None = None,
    api_key_env: str | None = DEFAULT_API_KEY_ENV,
    concurrency: int = 32,
    timeout: float = 60.0,
    max_retries: int = 3,
    seed: int | None = None,
    **backend_kwargs: Any,
) -> ReflectionPlayer:
    """The reflection player of ``backend`` with the shared generation settings.

    * ``hf``: ``model`` (a loaded causal LM) and ``tokenizer`` are required; the server settings are ignored.
      ``backend_kwargs`` go to :class:`ReflectionModel` (``shared_prefix_min_tokens``, ``cache_implementation``).
    * ``openai``: ``base_url`` and ``model_name`` (the served model's name) are required; ``tokenizer`` is
      optional (the reflection model's tokenizer, loaded locally: it lets the rollout reuse prompt ids and
      enables ``max_prompt_length``); ``model`` must be None. The API key is read from the environment
      variable ``api_key_env``. ``backend_kwargs`` go to :class:`RemoteReflectionModel` (``deadline``,
      ``prompts_per_request``, ``backoff_base``, ``backoff_max``, ``extra_body``).
    """
    if backend == "hf":
        if model is None or tokenizer is None:
            raise ValueError(
                "reflection backend 'hf' needs the loaded reflection model and its tokenizer "
                "(set reflection_model_name_or_path, or choose reflection_backend 'openai' with a server)"
            )
        return ReflectionModel(
            model,
            tokenizer,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            max_prompt_length=max_prompt_length,
            **backend_kwargs,
        )
    if backend == "openai":
        if not base_url or not model_name:
            raise ValueError(
                "reflection backend 'openai' needs the server's base_url (e.g. http://127.0.0.1:8000/v1) and the "
                f"served model's name; got base_url={base_url!r}, model_name={model_name!r}"
            )
        if model is not None:
            raise ValueError(
                "reflection backend 'openai' runs the reflection model on the server: do not load it locally too"
            )
        return RemoteReflectionModel(
            base_url,
            model_name,
            tokenizer=tokenizer,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            max_prompt_length=max_prompt_length,
            api_key_env=api_key_env,
            concurrency=concurrency,
            timeout=timeout,
            max_retries=max_retries,
            seed=seed,
            **backend_kwargs,
        )
    raise ValueError(f"reflection backend {backend!r} is unknown; choose one of {REFLECTION_BACKENDS}")


__all__ = ["REFLECTION_BACKENDS", "ReflectionPlayer", "make_reflection_player"]
