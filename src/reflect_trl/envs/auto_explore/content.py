"""Truncation of file contents shown by ``cat``, measured with the policy model's own tokenizer.

The tokenizer is loaded with ``AutoTokenizer.from_pretrained(path, local_files_only=True)`` -- never a
download (the reference code's tiktoken download inside env steps is gone). Without a tokenizer, a "token"
is a run of word characters or a single punctuation character (an approximation of BPE counts on code). Tokenizers are cached per process and used under a lock (HF fast
tokenizers are not safe to call concurrently), so envs in threads can share them.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from reflect_trl.envs.auto_explore.corpus import file_kind

#: Data files (csv/tsv) show at most this many lines, whatever ``max_lines`` says (the paper showed 5).
DATA_FILE_MAX_LINES = 5

_APPROX_TOKEN = re.compile(r"\w+|[^\w\s]")
_TOKENIZERS: dict[str, Any] = {}
_TOKENIZER_LOCK = threading.RLock()


def load_tokenizer(name_or_path: str | None) -> Any:
    """The tokenizer at a local path (shared per process); None gives None (whitespace counting)."""
    if name_or_path is None:
        return None
    with _TOKENIZER_LOCK:
        if name_or_path not in _TOKENIZERS:
            from transformers import AutoTokenizer

            try:
                _TOKENIZERS[name_or_path] = AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
            except OSError as exc:
                raise OSError(
                    f"auto_explore: cannot load tokenizer_name_or_path={name_or_path!r} from local files "
                    f"(no downloads are attempted): {exc}"
                ) from exc
        return _TOKENIZERS[name_or_path]


_COMMENT_PREFIXES = ("#", "//", "/*", "*", "*/")
_LICENSE_WORDS = ("license", "copyright")


def strip_boilerplate(text: str) -> str:
    """Drop a leading license/copyright comment block (after an optional shebang) and squeeze runs of
    blank lines, so the few lines shown are the file's own content."""
    lines = text.split("\n")
    start = 1 if lines and lines[0].startswith("#!") else 0
    end = start
    while end < len(lines) and (not lines[end].strip() or lines[end].lstrip().startswith(_COMMENT_PREFIXES)):
        end += 1
    block = "\n".join(lines[start:end]).lower()
    if any(word in block for word in _LICENSE_WORDS):
        lines = lines[:start] + lines[end:]
    out: list[str] = []
    for line in lines:
        if line.strip() or (out and out[-1].strip()):
            out.append(line)
    return "\n".join(out)


def _cut_approx(text: str, max_tokens: int) -> tuple[str, bool]:
    """Without a tokenizer, a "token" is a run of word characters or one punctuation character (close to
    what a BPE tokenizer makes of code); the text is cut after the ``max_tokens``-th one."""
    for count, match in enumerate(_APPROX_TOKEN.finditer(text), start=1):
        if count == max_tokens:
            rest = text[match.end() :]
            return text[: match.end()], bool(_APPROX_TOKEN.search(rest))
    return text, False


def _cut_tokens(text: str, max_tokens: int, tokenizer: Any) -> tuple[str, bool]:
    with _TOKENIZER_LOCK:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) <= max_tokens:
            return text, False
        return tokenizer.decode(ids[:max_tokens], skip_special_tokens=True), True


def truncate_content(text: str, path: str, *, max_lines: int, max_tokens: int, tokenizer: Any = None) -> str:
    """The first ``max_lines`` lines (fewer for data files) after :func:`strip_boilerplate`, then at most
    ``max_tokens`` tokens, with a note when something was cut."""
    if max_lines < 1 or max_tokens < 1:
        raise ValueError(f"max_lines and max_tokens must be >= 1, got {max_lines} and {max_tokens}")
    text = strip_boilerplate(text.replace("\r\n", "\n")).rstrip("\n")
    line_limit = min(max_lines, DATA_FILE_MAX_LINES) if file_kind(path) == "data" else max_lines
    lines = text.split("\n")
    cut_lines = len(lines) > line_limit
    text = "\n".join(lines[:line_limit])
    if tokenizer is None:
        text, cut_tokens = _cut_approx(text, max_tokens)
    else:
        text, cut_tokens = _cut_tokens(text, max_tokens, tokenizer)
    if cut_lines or cut_tokens:
        text = f"{text.rstrip()}\n[Large file: only the first {line_limit} lines / {max_tokens} tokens are shown.]"
    return text
