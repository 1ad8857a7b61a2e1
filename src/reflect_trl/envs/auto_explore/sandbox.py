"""A pure-Python, read-only command sandbox over one :class:`~.corpus.RepoTree`.

It understands three commands -- ``cd <dir>``, ``cat <file>``, ``id <file>`` -- parsed with :mod:`shlex`
(a parser only: there is no shell, no subprocess and no ``os.chdir``; the working directory is an argument).
Every path goes through :meth:`RepoSandbox.resolve`:

1. the argument must be non-empty, relative (no ``/...``, ``~``, drive letters), without NUL or control
   characters;
2. it is joined to the working directory and normalised *lexically*; ``..`` past the repository root is
   refused;
3. the on-disk path is resolved with ``os.path.realpath``: it must stay under the repository root and must
   not pass through a symbolic link (links are never followed, inside the root or out of it);
4. the path must be part of the corpus (hidden, filtered or unknown entries are "not found").

Only then is anything read, with ``O_NOFOLLOW``, at most ``max_read_bytes`` bytes, and only regular files.
Refusals raise :class:`SandboxError` inside :meth:`resolve`; :meth:`execute` turns them into an
``Error: ...`` message. A sandbox holds no mutable state, so episodes may share it across threads.
"""

from __future__ import annotations

import os
import shlex
import stat
from collections.abc import Callable
from dataclasses import dataclass

from reflect_trl.envs.auto_explore.corpus import RepoTree

COMMANDS = ("cd", "cat", "id")


class SandboxError(Exception):
    """A command or path the sandbox refuses; the message says why (and never shows outside content)."""


@dataclass(frozen=True)
class CommandResult:
    """The outcome of one command: the messages to show, the working directory afterwards, what was hit."""

    command: str
    verb: str | None
    path: str | None  # the repository path the command acted on (None when refused)
    ok: bool
    message: str
    cwd: str


def quote_name(name: str) -> str:
    """A file name as it appears in a command: double-quoted if it has spaces, shell-quoted if odd."""
    if name and all(ch.isalnum() or ch in "._-+@%=,:" for ch in name):
        return name
    if " " in name and not any(ch in name for ch in "\"\\$`'"):
        return f'"{name}"'
    return shlex.quote(name)


def display_dir(rel: str) -> str:
    """How a working directory is shown: ``"./"`` at the root, else ``"a/b/"``."""
    return f"{rel}/" if rel else "./"


class RepoSandbox:
    """Resolves and executes ``cd``/``cat``/``id`` inside one repository tree, read-only."""

    def __init__(
        self,
        tree: RepoTree,
        *,
        max_read_bytes: int = 64_000,
        format_content: Callable[[str, str], str] | None = None,
    ) -> None:
        self.tree = tree
        self.root = os.path.realpath(tree.root)
        self.max_read_bytes = max_read_bytes
        self.format_content = format_content or (lambda rel, text: text)

    # -- paths ---------------------------------------------------------------------------------------
    def resolve(self, cwd: str, arg: str) -> str:
        """The repository path ``arg`` names from ``cwd``; raises :class:`SandboxError` if refused."""
        if not isinstance(arg, str) or not arg:
            raise SandboxError("an empty path names nothing")
        if "\x00" in arg:
            raise SandboxError("refused: the path contains a NUL byte")
        if any(not ch.isprintable() for ch in arg):
            raise SandboxError(f"refused: the path {arg!r} contains control characters")
        drive = len(arg) > 1 and arg[0].isalpha() and arg[1] == ":" and arg[2:3] in ("", "/", "\\")
        if arg.startswith(("/", "\\", "~")) or drive or os.path.isabs(arg):
            raise SandboxError(f"refused: absolute path {arg!r}; paths are relative to the working directory")
        if "\\" in arg:
            raise SandboxError(f"refused: backslash in path {arg!r}")
        if not self.tree.is_dir(cwd):
            raise SandboxError(f"refused: the working directory {cwd!r} is not part of the repository")
        parts: list[str] = [p for p in cwd.split("/") if p]
        for part in arg.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if not parts:
                    raise SandboxError(f"refused: {arg!r} leads outside the repository")
                parts.pop()
            else:
                parts.append(part)
        rel = "/".join(parts)
        mount = self.tree.mount
        if mount and rel and rel != mount and not rel.startswith(mount + "/"):
            raise SandboxError(f"refused: {arg!r} leads outside the repository")
        if not (mount and rel == ""):
            self._check_on_disk(arg, self.tree.real_path(rel))
        if not (self.tree.is_dir(rel) or self.tree.is_file(rel)):
            raise SandboxError(f"{arg}: no such file or directory")
        return rel

    def _check_on_disk(self, arg: str, lexical: str) -> None:
        lexical = os.path.normpath(lexical)
        real = os.path.realpath(lexical)
        if os.path.commonpath([real, self.root]) != self.root:
            how = " through a symbolic link" if os.path.commonpath([lexical, self.root]) == self.root else ""
            raise SandboxError(f"refused: {arg!r} leads outside the repository{how}")
        if real != lexical:
            raise SandboxError(f"refused: {arg!r} goes through a symbolic link; links are not followed")

    def read(self, rel: str) -> str:
        """The text of a corpus file (at most ``max_read_bytes`` bytes, UTF-8 with replacement)."""
        if not self.tree.is_file(rel):
            raise SandboxError(f"{rel}: no such file")
        real = os.path.normpath(self.tree.real_path(rel))
        self._check_on_disk(rel, real)
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(real, flags)
        except OSError as exc:
            raise SandboxError(f"{rel}: cannot be read ({exc.strerror})") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SandboxError(f"{rel}: not a regular file")
            chunks: list[bytes] = []
            remaining = self.max_read_bytes
            while remaining > 0:
                chunk = os.read(fd, remaining)
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
        finally:
            os.close(fd)
        return b"".join(chunks).decode("utf-8", errors="replace")

    # -- commands ------------------------------------------------------------------------------------
    def execute(self, cwd: str, command: str) -> CommandResult:
        """Run one command from ``cwd``. Refusals come back as ``ok=False`` with an ``Error:`` message."""
        lines = [f"Executing: {command}"]
        try:
            verb, arg = parse_command(command)
            rel = self.resolve(cwd, arg)
            if verb == "cd":
                if not self.tree.is_dir(rel):
                    raise SandboxError(f"{arg}: not a directory")
                lines.append(f"Success: Now at {display_dir(rel)}")
                return CommandResult(command, verb, rel, True, "\n".join(lines), rel)
            if not self.tree.is_file(rel):
                raise SandboxError(f"{arg}: is a directory, not a file")
            if verb == "cat":
                content = self.format_content(rel, self.read(rel))
                lines.append(f"Success: The content of {arg} is:\n{content}")
            else:
                lines.append(f"Success: Identified file {arg}")
            return CommandResult(command, verb, rel, True, "\n".join(lines), cwd)
        except SandboxError as exc:
            lines.append(f"Error: {exc}")
            return CommandResult(command, None, None, False, "\n".join(lines), cwd)


def parse_command(command: str) -> tuple[str, str]:
    """Split ``"<verb> <path>"``; raises :class:`SandboxError` for anything else."""
    if "\x00" in command:
        raise SandboxError("refused: the command contains a NUL byte")
    try:
        words = shlex.split(command, posix=True)
    except ValueError as exc:
        raise SandboxError(f"cannot parse command {command!r}: {exc}") from None
    if not words:
        raise SandboxError("empty command")
    if words[0] not in COMMANDS:
        raise SandboxError(f"unsupported command {words[0]!r}; use one of {', '.join(COMMANDS)}")
    if len(words) != 2:
        raise SandboxError(f"{words[0]} takes exactly one path, got {len(words) - 1}")
    return words[0], words[1]
