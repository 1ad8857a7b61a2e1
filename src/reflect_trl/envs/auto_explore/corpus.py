"""The AutoExplore corpus: filtered, read-only views of source trees (git checkouts, installed packages).

A :class:`RepoTree` is built once by walking a directory and keeping only what the Reflect-RL filters keep
(method notes, section 4.1, step 1):

* files with an allowed suffix (:data:`ALLOWED_SUFFIXES`: code, data, text and shell files);
* no hidden or private names (starting with ``"."`` or ``"_"`` -- this drops ``__init__.py`` too, as the
  paper's filter did; ``CorpusFilter(keep_init_files=True)`` keeps them), no non-ASCII or odd names
  (whitespace other than spaces, quotes, backslashes, control characters);
* no test, build, cache or packaging directories (:data:`EXCLUDED_DIR_NAMES`, ``test_*``, ``*.egg-info``)
  and no test files (``test_*.py``, ``*_test.py``, ``conftest.py``);
* only UTF-8 text of at least ``min_chars`` characters, at most ``max_bytes`` bytes and at least
  ``min_ascii_ratio`` ASCII;
* directories with nothing left inside are dropped.

Symbolic links are never followed (neither out of the root nor inside it: no cycles, no aliases). Listings
are sorted, so everything is deterministic.

**Option budget.** The policy sees at most ``max_options`` options in one prompt (62 = the number of default
option labels). A directory yields ``cd ..`` (except at the root), one ``cd <dir>`` per subdirectory and a
``cat``/``id`` pair per file. A directory that would yield more is *pruned*: its entries are ranked by a
stable hash of their path and kept in that order while the budget allows (a directory costs one option, a
file two); what does not fit is hidden together with its subtree. Pruning is deterministic, unbiased with
respect to names, and happens before task generation, so every generated target is reachable. Tasks loaded
from a file may name entries that pruning hid: :meth:`RepoTree.listing` takes ``protect`` paths that are
always kept (other entries make room for them).

**Installed packages** are presented like a git checkout: the repository root holds one folder, the
package (``trl/``), so ``trl/trainer/sft_trainer.py`` has depth 2. The default corpus
(:func:`default_roots`) is the source of installed ``trl``, ``peft``, ``datasets`` and ``accelerate``:
it works offline on a fresh install, and :func:`corpus_card` records the package versions.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

CODE_SUFFIXES = (".py", ".c", ".cpp", ".cxx", ".cc", ".h", ".hpp", ".hxx", ".cs", ".java", ".go", ".ipynb")
DATA_SUFFIXES = (".csv", ".tsv")
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".json", ".yaml", ".yml")
EXEC_SUFFIXES = (".sh", ".bash", ".zsh")
ALLOWED_SUFFIXES: frozenset[str] = frozenset(CODE_SUFFIXES + DATA_SUFFIXES + TEXT_SUFFIXES + EXEC_SUFFIXES)

EXCLUDED_DIR_NAMES: frozenset[str] = frozenset(
    {
        "test",
        "tests",
        "testing",
        "test_utils",
        "build",
        "dist",
        "__pycache__",
        "node_modules",
        "site-packages",
        "venv",
    }
)
EXCLUDED_FILE_NAMES: frozenset[str] = frozenset({"conftest.py", "setup.py"})

#: The default corpus: installed packages whose source trees are read (all are dependencies of reflect-trl).
DEFAULT_PACKAGES: tuple[str, ...] = ("trl", "peft", "datasets", "accelerate")
#: Maximum options one directory may yield (= ``len(reflect_trl.prompts.DEFAULT_LABELS)``).
DEFAULT_MAX_OPTIONS = 62


_ASCII_BYTES = bytes(range(128))


def file_kind(name: str) -> str:
    """``"code"``, ``"data"``, ``"text"``, ``"exec"`` or ``"other"`` from a file name's suffix."""
    suffix = os.path.splitext(name)[1].lower()
    for kind, suffixes in (
        ("code", CODE_SUFFIXES),
        ("data", DATA_SUFFIXES),
        ("text", TEXT_SUFFIXES),
        ("exec", EXEC_SUFFIXES),
    ):
        if suffix in suffixes:
            return kind
    return "other"


def is_plain_name(name: str) -> bool:
    """A printable-ASCII name without quotes, backslashes or whitespace other than a plain space."""
    if not name or name in (".", ".."):
        return False
    if not name.isascii() or not name.isprintable():
        return False
    return not any(ch in name for ch in "\"'\\/`$")


@dataclass(frozen=True)
class CorpusFilter:
    """Which entries of a source tree become part of the corpus (see the module docstring)."""

    suffixes: frozenset[str] = ALLOWED_SUFFIXES
    excluded_dir_names: frozenset[str] = EXCLUDED_DIR_NAMES
    excluded_file_names: frozenset[str] = EXCLUDED_FILE_NAMES
    keep_init_files: bool = False
    min_chars: int = 20
    max_bytes: int = 1_000_000
    min_ascii_ratio: float = 0.9

    def keeps_dir(self, name: str) -> bool:
        if not is_plain_name(name) or name.startswith((".", "_")):
            return False
        lower = name.lower()
        if (
            lower in self.excluded_dir_names
            or lower.startswith("test_")
            or lower.endswith(("_test", "_tests"))
        ):
            return False
        return not lower.endswith((".egg-info", ".dist-info"))

    def keeps_file_name(self, name: str) -> bool:
        if not is_plain_name(name):
            return False
        if name.startswith((".", "_")) and not (self.keep_init_files and name == "__init__.py"):
            return False
        lower = name.lower()
        if lower in self.excluded_file_names or lower.startswith("test_"):
            return False
        stem, suffix = os.path.splitext(lower)
        return suffix in self.suffixes and not stem.endswith("_test")

    def keeps_content(self, data: bytes) -> bool:
        """UTF-8 text, long enough, mostly ASCII, no NUL bytes."""
        if len(data) > self.max_bytes or b"\x00" in data:
            return False
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return False
        if len(text.strip()) < self.min_chars:
            return False
        ascii_chars = len(data) - len(data.translate(None, _ASCII_BYTES))  # bytes < 0x80 are ASCII chars
        return ascii_chars >= self.min_ascii_ratio * len(text)


@dataclass(frozen=True)
class Listing:
    """The entries of one directory: subdirectory names and file names, each sorted."""

    dirs: tuple[str, ...] = ()
    files: tuple[str, ...] = ()

    def num_options(self, at_root: bool) -> int:
        return (0 if at_root else 1) + len(self.dirs) + 2 * len(self.files)


def join_rel(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


def _rank(path: str) -> str:
    return hashlib.sha1(path.encode()).hexdigest()


@dataclass
class RepoTree:
    """A filtered, pruned, read-only view of one repository.

    Paths are POSIX strings relative to the repository root (``""`` is the root). ``mount`` is non-empty for
    an installed package: the root then only holds the folder ``mount`` and ``root`` is the package dir.
    ``full`` holds every listing kept by the filter, ``pruned`` the listings within the option budget.
    """

    name: str
    root: str
    mount: str
    version: str | None
    source: str
    max_options: int
    full: dict[str, Listing]
    pruned: dict[str, Listing] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)

    # -- queries on the filtered tree --------------------------------------------------------------------
    def is_dir(self, rel: str) -> bool:
        return rel in self.full

    def is_file(self, rel: str) -> bool:
        parent, _, name = rel.rpartition("/")
        listing = self.full.get(parent)
        return listing is not None and name in listing.files

    def real_path(self, rel: str) -> str:
        """The on-disk path of a repository path (no checks: use the sandbox to read)."""
        if self.mount:
            if rel == "":
                raise ValueError(f"{self.name}: the repository root of a package is virtual")
            if rel != self.mount and not rel.startswith(self.mount + "/"):
                raise ValueError(f"{self.name}: {rel!r} is not under the package folder {self.mount!r}")
            rel = rel[len(self.mount) + 1 :]
        return os.path.join(self.root, *rel.split("/")) if rel else self.root

    def listing(self, rel_dir: str, protect: Iterable[str] = ()) -> Listing:
        """The directory's entries within the option budget; ``protect`` paths (anywhere) below this
        directory keep their entry here even if pruning would hide it."""
        if rel_dir not in self.full:
            raise KeyError(f"{self.name}: no directory {rel_dir!r} in the corpus")
        keep = {_first_component(rel_dir, p) for p in protect}
        keep.discard(None)
        if not keep or keep <= set(self.pruned[rel_dir].dirs) | set(self.pruned[rel_dir].files):
            return self.pruned[rel_dir]
        return _prune(self.full[rel_dir], rel_dir, self.max_options, keep)  # type: ignore[arg-type]

    def walk_files(self) -> list[str]:
        """Every file reachable in the pruned view, sorted."""
        out: list[str] = []
        stack = [""]
        while stack:
            rel = stack.pop()
            listing = self.pruned[rel]
            out.extend(join_rel(rel, f) for f in listing.files)
            stack.extend(join_rel(rel, d) for d in listing.dirs)
        return sorted(out)


def _first_component(rel_dir: str, path: str) -> str | None:
    """The entry of ``rel_dir`` on the way to ``path`` (None if ``path`` is not strictly below it)."""
    prefix = f"{rel_dir}/" if rel_dir else ""
    if not path.startswith(prefix) or path == rel_dir:
        return None
    return path[len(prefix) :].split("/", 1)[0]


def _prune(
    listing: Listing, rel_dir: str, max_options: int, keep: set[str] | frozenset[str] = frozenset()
) -> Listing:
    """Keep entries by stable-hash rank within the option budget; ``keep`` names are kept first."""
    budget = max_options - (0 if rel_dir == "" else 1)
    if listing.num_options(at_root=rel_dir == "") <= max_options:
        return listing
    entries = [(name, 1) for name in listing.dirs] + [(name, 2) for name in listing.files]
    present = {name for name, _ in entries}
    missing = set(keep) - present
    if missing:
        raise KeyError(f"cannot protect {sorted(missing)}: not entries of directory {rel_dir!r}")
    entries.sort(key=lambda e: (e[0] not in keep, _rank(join_rel(rel_dir, e[0]))))
    kept: set[str] = set()
    for name, cost in entries:
        if cost <= budget:
            kept.add(name)
            budget -= cost
        elif name in keep:
            raise ValueError(
                f"directory {rel_dir!r}: the protected entries {sorted(keep)} need more than the option budget"
            )
    return Listing(
        dirs=tuple(d for d in listing.dirs if d in kept), files=tuple(f for f in listing.files if f in kept)
    )


def build_repo_tree(
    root: str | os.PathLike[str],
    name: str | None = None,
    *,
    mount: str = "",
    version: str | None = None,
    source: str = "path",
    corpus_filter: CorpusFilter | None = None,
    max_options: int = DEFAULT_MAX_OPTIONS,
) -> RepoTree:
    """Walk ``root`` (without following symlinks) and build its filtered, pruned tree."""
    flt = corpus_filter or CorpusFilter()
    if max_options < 4:
        raise ValueError(
            f"max_options must be >= 4 (cd .. plus one file's cat/id and a cd), got {max_options}"
        )
    real_root = os.path.realpath(root)
    if not os.path.isdir(real_root):
        raise FileNotFoundError(f"corpus root {str(root)!r} is not a directory")
    name = name or mount or os.path.basename(real_root.rstrip(os.sep)) or "repo"
    stats = {"files_seen": 0, "files_kept": 0, "dirs_kept": 0, "symlinks_skipped": 0}
    full: dict[str, Listing] = {}

    def walk(real_dir: str, rel: str) -> bool:
        try:
            with os.scandir(real_dir) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            logger.warning("auto_explore corpus: cannot list %s (%s); skipped", real_dir, exc)
            return False
        dirs: list[str] = []
        files: list[str] = []
        for entry in entries:
            if entry.is_symlink():
                stats["symlinks_skipped"] += 1
                continue
            if entry.is_dir(follow_symlinks=False):
                if flt.keeps_dir(entry.name) and walk(entry.path, join_rel(rel, entry.name)):
                    dirs.append(entry.name)
            elif entry.is_file(follow_symlinks=False):
                stats["files_seen"] += 1
                if flt.keeps_file_name(entry.name) and _content_ok(entry.path, flt):
                    files.append(entry.name)
        if not dirs and not files:
            return False
        full[rel] = Listing(tuple(dirs), tuple(files))
        stats["files_kept"] += len(files)
        return True

    if mount:
        if not walk(real_root, mount):
            raise ValueError(f"corpus root {real_root!r} ({name}) has no file that passes the filters")
        full[""] = Listing(dirs=(mount,))
    elif not walk(real_root, ""):
        raise ValueError(f"corpus root {real_root!r} ({name}) has no file that passes the filters")
    stats["dirs_kept"] = len(full)
    tree = RepoTree(
        name=name,
        root=real_root,
        mount=mount,
        version=version,
        source=source,
        max_options=max_options,
        full=full,
    )
    tree.pruned = {rel: _prune(listing, rel, max_options) for rel, listing in full.items()}
    reachable = set(tree.walk_files())
    stats["files_reachable"] = len(reachable)
    stats["files_pruned"] = stats["files_kept"] - len(reachable)
    tree.stats = stats
    return tree


def _content_ok(path: str, flt: CorpusFilter) -> bool:
    try:
        if os.path.getsize(path) > flt.max_bytes:
            return False
        with open(path, "rb") as fh:
            data = fh.read(flt.max_bytes + 1)
    except OSError:
        return False
    return flt.keeps_content(data)


# -- roots ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RootSpec:
    """Where one repository comes from: a directory, or an installed package (``package`` set)."""

    name: str
    path: str
    package: str | None = None
    version: str | None = None


def package_root(package: str) -> RootSpec:
    """The source directory and version of an installed (importable) package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"auto_explore corpus: package {package!r} is not installed (or not a package)"
        )
    path = os.path.realpath(list(spec.submodule_search_locations)[0])
    try:
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        version = None
    return RootSpec(name=package, path=path, package=package, version=version)


def default_roots(packages: Sequence[str] = DEFAULT_PACKAGES) -> list[RootSpec]:
    """The installed packages of the default corpus (missing ones are skipped with a warning)."""
    roots = []
    for package in packages:
        try:
            roots.append(package_root(package))
        except ModuleNotFoundError as exc:
            logger.warning("%s; left out of the default corpus", exc)
    if not roots:
        raise RuntimeError(f"auto_explore: none of the default corpus packages {list(packages)} is installed")
    return roots


def parse_roots(roots: str | Sequence[str] | Mapping[str, str] | None) -> list[RootSpec]:
    """Normalise the ``roots`` option (JSON/YAML-friendly).

    * ``None``: :func:`default_roots`;
    * a list of strings: ``"pkg:NAME"`` (an installed package), ``"path:DIR"``, or a bare string -- a
      directory if it contains a path separator or exists, else a package name;
    * a mapping ``{repo_name: <string as above>}`` to choose repository names.
    """
    if roots is None:
        return default_roots()
    if isinstance(roots, str):
        roots = [roots]
    items: list[tuple[str | None, str]]
    if isinstance(roots, Mapping):
        items = [(str(k), str(v)) for k, v in roots.items()]
    else:
        items = [(None, str(v)) for v in roots]
    specs: list[RootSpec] = []
    for name, value in items:
        if value.startswith("pkg:"):
            spec = package_root(value[4:])
        elif value.startswith("path:") or "/" in value or os.sep in value or os.path.isdir(value):
            path = value[5:] if value.startswith("path:") else value
            path = os.path.expanduser(path)
            if not os.path.isdir(path):
                raise FileNotFoundError(f"auto_explore roots: {value!r} is not a directory")
            real = os.path.realpath(path)
            spec = RootSpec(name=os.path.basename(real.rstrip(os.sep)) or "repo", path=real)
        else:
            spec = package_root(value)
        if name:
            spec = RootSpec(name=name, path=spec.path, package=spec.package, version=spec.version)
        specs.append(spec)
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"auto_explore roots: repository names {dupes} repeat; name them with a mapping")
    return specs


@dataclass
class Corpus:
    """Several repositories, by name (sorted)."""

    repos: dict[str, RepoTree]
    max_options: int

    def repo(self, name: str) -> RepoTree:
        if name not in self.repos:
            raise KeyError(
                f"auto_explore: repository {name!r} is not in the corpus; known: {sorted(self.repos)}"
            )
        return self.repos[name]

    @property
    def names(self) -> list[str]:
        return sorted(self.repos)


def build_corpus(
    roots: str | Sequence[str] | Mapping[str, str] | None = None,
    *,
    max_options: int = DEFAULT_MAX_OPTIONS,
    corpus_filter: CorpusFilter | None = None,
) -> Corpus:
    """Build the corpus of ``roots`` (see :func:`parse_roots`); packages are mounted under their name."""
    repos: dict[str, RepoTree] = {}
    for spec in parse_roots(roots):
        repos[spec.name] = build_repo_tree(
            spec.path,
            spec.name,
            mount=spec.package or "",
            version=spec.version,
            source="package" if spec.package else "path",
            corpus_filter=corpus_filter,
            max_options=max_options,
        )
    return Corpus(repos=dict(sorted(repos.items())), max_options=max_options)


_CACHE: dict[Any, Corpus] = {}
_CACHE_LOCK = threading.Lock()


def load_corpus(
    roots: str | Sequence[str] | Mapping[str, str] | None = None,
    *,
    max_options: int = DEFAULT_MAX_OPTIONS,
    corpus_filter: CorpusFilter | None = None,
) -> Corpus:
    """:func:`build_corpus`, memoised per process (the trees are read-only and shared by all envs)."""
    specs = tuple(parse_roots(roots))
    key = (specs, max_options, corpus_filter or CorpusFilter())
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = build_corpus(
                {s.name: (f"pkg:{s.package}" if s.package else f"path:{s.path}") for s in specs},
                max_options=max_options,
                corpus_filter=corpus_filter,
            )
        return _CACHE[key]


def corpus_card(corpus: Corpus) -> dict[str, Any]:
    """A JSON-able description of the corpus: repositories, package versions, file and directory counts."""
    return {
        "max_options": corpus.max_options,
        "repositories": [
            {
                "name": tree.name,
                "source": tree.source,
                "version": tree.version,
                "root": tree.root,
                **tree.stats,
            }
            for tree in corpus.repos.values()
        ],
    }
