"""The ``packages`` corpus of AutoExplore: many small real code bases, pinned, offline, split by repository.

**What.** :data:`PACKAGE_CORPUS` lists small pure-Python packages with permissive licences (MIT, BSD, Apache-2.0,
ISC, PSF, public domain), each at an exact version. They are the optional extra ``auto-explore-corpus`` of
``pyproject.toml`` (``pip install -e '.[auto-explore-corpus]'``; ``make install-extras`` installs it), so the corpus
comes from the package registry as pinned wheels and works offline afterwards. **Each distribution is one
repository**: its import package's installed source folder (``dns/`` of ``dnspython``, ``jwt/`` of ``pyjwt``),
mounted at the repository root as the default corpus mounts ``trl/`` (:mod:`.corpus`). The folder is found through
:mod:`importlib.metadata` (the distribution's file list and ``locate_file``); no corpus package is ever imported.
An installed version other than the pinned one is refused (the questions would change with it).

**Splits.** Whole repositories go to one split: ``train`` / ``validation`` / ``test`` by a stable hash of the
repository name (:func:`reflect_trl.envs.auto_explore.tasks.repo_split`, 60/20/20; ``split_unit="repo"``). Every
task of a repository carries that repository's split, so no ``test`` repository ever appears in ``train`` or
``validation``, by construction, and adding or removing a package never moves another one. The split depends on no
seed and on no other repository.

**Questions** are generated from the code exactly as for any corpus (:mod:`.tasks`: definitions, docstrings,
headings, settings, file names; one answer file each), so the environment's oracle solves every task.

**Use.** ``AutoExploreEnv(corpus="packages")`` / ``env_kwargs: {corpus: packages}``; ``reflect-trl corpus-stats``
(or ``python -m reflect_trl.envs.auto_explore``) prints repositories, tasks and distinct questions per split
and stage. ``docs/auto_explore_corpus.md`` has the measured numbers.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reflect_trl.envs.auto_explore.corpus import (
    DEFAULT_MAX_OPTIONS,
    Corpus,
    CorpusFilter,
    RootSpec,
    build_repo_tree,
)

#: The name of the optional extra in ``pyproject.toml`` and the command that installs it.
EXTRA = "auto-explore-corpus"
INSTALL_COMMAND = f"pip install -e '.[{EXTRA}]'"


@dataclass(frozen=True)
class CorpusPackage:
    """One repository of the ``packages`` corpus: a pinned distribution and the import package that is its tree."""

    dist: str
    version: str
    import_name: str
    licence: str

    @property
    def name(self) -> str:
        """The repository name: the distribution's normalised name (PEP 503)."""
        return canonical_name(self.dist)

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"


def canonical_name(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


_P = CorpusPackage
#: The repositories (sorted by name). Small, pure-Python (``py3-none-any`` wheels), permissive licences, and none a
#: dependency of reflect-trl itself; packages that install stray top-level folders, or keep fewer than three files
#: after the corpus filter, were left out.
PACKAGE_CORPUS: tuple[CorpusPackage, ...] = (
    _P("altgraph", "0.17.5", "altgraph", "MIT"),
    _P("argcomplete", "3.7.2", "argcomplete", "Apache-2.0"),
    _P("asn1crypto", "1.5.1", "asn1crypto", "MIT"),
    _P("astor", "0.8.1", "astor", "BSD-3-Clause"),
    _P("astral", "3.2", "astral", "Apache-2.0"),
    _P("asttokens", "3.0.2", "asttokens", "Apache-2.0"),
    _P("attrs", "26.1.0", "attr", "MIT"),
    _P("boltons", "26.2.0", "boltons", "BSD-3-Clause"),
    _P("cerberus", "1.3.8", "cerberus", "ISC"),
    _P("chevron", "0.14.0", "chevron", "MIT"),
    _P("colorlog", "6.12.0", "colorlog", "MIT"),
    _P("commonmark", "0.9.2", "commonmark", "BSD-3-Clause"),
    _P("construct", "2.10.70", "construct", "MIT"),
    _P("dacite", "1.9.2", "dacite", "MIT"),
    _P("defusedxml", "0.7.1", "defusedxml", "PSF-2.0"),
    _P("distlib", "0.4.4", "distlib", "PSF-2.0"),
    _P("dnspython", "2.9.2", "dns", "ISC"),
    _P("docstring-parser", "0.18.0", "docstring_parser", "MIT"),
    _P("elementpath", "5.1.4", "elementpath", "MIT"),
    _P("filetype", "1.2.0", "filetype", "MIT"),
    _P("funcy", "2.1", "funcy", "BSD-3-Clause"),
    _P("gast", "0.7.0", "gast", "BSD-3-Clause"),
    _P("geographiclib", "2.1", "geographiclib", "MIT"),
    _P("geopy", "2.5.0", "geopy", "MIT"),
    _P("graphviz", "0.21", "graphviz", "MIT"),
    _P("hpack", "4.2.0", "hpack", "MIT"),
    _P("humanfriendly", "10.0", "humanfriendly", "MIT"),
    _P("humanize", "4.17.0", "humanize", "MIT"),
    _P("intervaltree", "3.2.1", "intervaltree", "Apache-2.0"),
    _P("invoke", "3.0.3", "invoke", "BSD-2-Clause"),
    _P("isodate", "0.7.2", "isodate", "BSD-3-Clause"),
    _P("itsdangerous", "2.2.0", "itsdangerous", "BSD-3-Clause"),
    _P("jedi", "0.20.1", "jedi", "MIT"),
    _P("joblib", "1.6.0", "joblib", "BSD-3-Clause"),
    _P("jsonpickle", "4.1.4", "jsonpickle", "BSD-3-Clause"),
    _P("lark", "1.3.1", "lark", "MIT"),
    _P("latexcodec", "3.0.1", "latexcodec", "MIT"),
    _P("mako", "1.4.3", "mako", "MIT"),
    _P("markdown", "3.11.3", "markdown", "BSD-3-Clause"),
    _P("marshmallow", "4.4.0", "marshmallow", "MIT"),
    _P("mistune", "3.4.0", "mistune", "BSD-3-Clause"),
    _P("multipledispatch", "1.0.0", "multipledispatch", "BSD-3-Clause"),
    _P("oauthlib", "4.0.1", "oauthlib", "BSD-3-Clause"),
    _P("openpyxl", "3.1.5", "openpyxl", "MIT"),
    _P("parsedatetime", "2.6", "parsedatetime", "Apache-2.0"),
    _P("parso", "0.8.7", "parso", "MIT"),
    _P("passlib", "1.7.4", "passlib", "BSD-3-Clause"),
    _P("pika", "1.4.4", "pika", "BSD-3-Clause"),
    _P("pkginfo", "2.0", "pkginfo", "MIT"),
    _P("plumbum", "2.0.2", "plumbum", "MIT"),
    _P("ply", "3.11", "ply", "BSD-3-Clause"),
    _P("prompt-toolkit", "3.0.53", "prompt_toolkit", "BSD-3-Clause"),
    _P("pure-eval", "0.2.4", "pure_eval", "MIT"),
    _P("pyasn1", "0.6.5", "pyasn1", "BSD-2-Clause"),
    _P("pyasn1-modules", "0.4.2", "pyasn1_modules", "BSD-2-Clause"),
    _P("pycparser", "3.12", "pycparser", "BSD-3-Clause"),
    _P("pydash", "8.1.0", "pydash", "MIT"),
    _P("pyelftools", "0.33", "elftools", "Unlicense"),
    _P("pyflakes", "4.1.0", "pyflakes", "MIT"),
    _P("pyglet", "2.1.19", "pyglet", "BSD-3-Clause"),
    _P("pyjwt", "2.15.1", "jwt", "MIT"),
    _P("pymysql", "1.2.4", "pymysql", "MIT"),
    _P("pyotp", "2.12.0", "pyotp", "MIT"),
    _P("pyserial", "3.5", "serial", "BSD-3-Clause"),
    _P("python-dotenv", "1.2.4", "dotenv", "BSD-3-Clause"),
    _P("rfc3986", "2.0.0", "rfc3986", "Apache-2.0"),
    _P("snowballstemmer", "3.1.1", "snowballstemmer", "BSD-3-Clause"),
    _P("sortedcontainers", "2.4.0", "sortedcontainers", "Apache-2.0"),
    _P("soupsieve", "4.1.1", "soupsieve", "MIT"),
    _P("sqlparse", "0.6.1", "sqlparse", "BSD-3-Clause"),
    _P("structlog", "26.1.0", "structlog", "MIT OR Apache-2.0"),
    _P("svgwrite", "1.4.3", "svgwrite", "MIT"),
    _P("tenacity", "9.2.1", "tenacity", "Apache-2.0"),
    _P("terminaltables", "3.1.10", "terminaltables", "MIT"),
    _P("timeago", "1.0.16", "timeago", "MIT"),
    _P("tinydb", "4.9.0", "tinydb", "MIT"),
    _P("toml", "0.10.2", "toml", "MIT"),
    _P("tomlkit", "0.15.2", "tomlkit", "MIT"),
    _P("toolz", "1.2.0", "toolz", "BSD-3-Clause"),
    _P("uncertainties", "3.2.3", "uncertainties", "BSD-3-Clause"),
    _P("uritemplate", "4.2.0", "uritemplate", "BSD-3-Clause OR Apache-2.0"),
    _P("validators", "0.36.0", "validators", "MIT"),
    _P("voluptuous", "0.16.0", "voluptuous", "BSD-3-Clause"),
    _P("whoosh", "2.7.4", "whoosh", "BSD-2-Clause"),
    _P("xlrd", "2.0.2", "xlrd", "BSD-3-Clause"),
)
del _P

#: Pinned too (so the install is reproducible) but not repositories: dependencies of corpus packages that reflect-trl
#: does not already install (openpyxl needs et-xmlfile, prompt-toolkit wcwidth).
DEPENDENCY_PINS: tuple[str, ...] = ("et-xmlfile==2.0.0", "wcwidth==0.9.4")


def extra_requirements() -> list[str]:
    """The requirements of the ``auto-explore-corpus`` extra, as ``pyproject.toml`` lists them."""
    return sorted([p.requirement for p in PACKAGE_CORPUS] + list(DEPENDENCY_PINS), key=str.lower)


class CorpusNotInstalledError(ModuleNotFoundError):
    """The pinned packages of the ``packages`` corpus are missing (or installed at another version)."""


def _locate(package: CorpusPackage) -> RootSpec | str:
    """The root of one corpus package, or why it cannot be used (found via importlib.metadata, never imported)."""
    try:
        dist = importlib.metadata.distribution(package.dist)
    except importlib.metadata.PackageNotFoundError:
        return f"{package.requirement} is not installed"
    if dist.version != package.version:
        return f"{package.dist} {dist.version} is installed, the corpus pins {package.requirement}"
    marker = f"{package.import_name}/__init__.py"
    if not any(str(f).replace(os.sep, "/") == marker for f in dist.files or ()):
        return f"{package.requirement} does not list {marker} among its installed files"
    path = os.path.realpath(str(dist.locate_file(package.import_name)))
    if not os.path.isdir(path):
        return f"{package.requirement}: its package folder {path} is missing"
    return RootSpec(name=package.name, path=path, package=package.import_name, version=dist.version)


def package_corpus_roots(packages: Sequence[CorpusPackage] = PACKAGE_CORPUS) -> list[RootSpec]:
    """Where each pinned package's source tree is; :class:`CorpusNotInstalledError` (naming the install command)
    when any is missing or at another version -- a partial corpus would silently change the splits' contents."""
    roots: list[RootSpec] = []
    problems: list[str] = []
    for package in packages:
        found = _locate(package)
        if isinstance(found, str):
            problems.append(found)
        else:
            roots.append(found)
    if problems:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        raise CorpusNotInstalledError(
            f"auto_explore corpus 'packages' needs the optional extra {EXTRA!r} ({len(problems)} of "
            f"{len(packages)} pinned packages unusable: {shown}). Install it with: {INSTALL_COMMAND} "
            "(or `make install-extras`)"
        )
    return roots


def packages_installed(packages: Sequence[CorpusPackage] = PACKAGE_CORPUS) -> bool:
    """Whether every pinned corpus package is installed at its pinned version."""
    return not any(isinstance(_locate(p), str) for p in packages)


_CACHE: dict[Any, Corpus] = {}
_CACHE_LOCK = threading.Lock()


def load_package_corpus(
    *,
    max_options: int = DEFAULT_MAX_OPTIONS,
    corpus_filter: CorpusFilter | None = None,
    packages: Sequence[CorpusPackage] = PACKAGE_CORPUS,
) -> Corpus:
    """The ``packages`` corpus (one repository per pinned package), memoised per process."""
    specs = tuple(package_corpus_roots(packages))
    key = (specs, max_options, corpus_filter or CorpusFilter())
    with _CACHE_LOCK:
        if key not in _CACHE:
            repos = {
                spec.name: build_repo_tree(
                    spec.path,
                    spec.name,
                    mount=spec.package or "",
                    version=spec.version,
                    source="package",
                    corpus_filter=corpus_filter,
                    max_options=max_options,
                )
                for spec in specs
            }
            _CACHE[key] = Corpus(repos=dict(sorted(repos.items())), max_options=max_options)
        return _CACHE[key]


# -- statistics --------------------------------------------------------------------------------------------------
def corpus_stats(corpus: str = "packages", **env_kwargs: Any) -> dict[str, Any]:
    """Repositories, tasks and distinct questions per split and stage of an AutoExplore corpus, as the environment
    serves them (``env_kwargs`` as for :class:`~reflect_trl.envs.auto_explore.AutoExploreEnv`, e.g. ``horizon``).

    ``distinct_questions`` counts distinct question texts; ``questions_also_in_train`` counts the distinct question
    texts of a split that are also asked in ``train`` (with ``split_unit="repo"`` necessarily about another
    repository: generic ones such as a common function name, which the repository split does not prevent)."""
    from reflect_trl.envs.auto_explore.env import AutoExploreEnv
    from reflect_trl.envs.auto_explore.tasks import STAGES
    from reflect_trl.envs.base import SPLITS

    env = AutoExploreEnv(corpus=corpus, **env_kwargs)
    pools = env.task_pools()
    out: dict[str, Any] = {
        "corpus": corpus,
        "split_unit": env.split_unit,
        "repositories": len(env.corpus.repos),
        "files": sum(len(tree.walk_files()) for tree in env.corpus.repos.values()),
        "splits": {},
    }
    train_questions = {t.data["question"] for stage in STAGES for t in pools["train"][stage]}
    for split in SPLITS:
        tasks = [t for stage in STAGES for t in pools[split][stage]]
        repos = sorted({t.data["repo"] for t in tasks})
        questions = {stage: {t.data["question"] for t in pools[split][stage]} for stage in STAGES}
        out["splits"][split] = {
            "repositories": len(repos),
            "repository_names": repos,
            "repositories_per_stage": {
                stage: len({t.data["repo"] for t in pools[split][stage]}) for stage in STAGES
            },
            "tasks": {stage: len(pools[split][stage]) for stage in STAGES},
            "distinct_questions": {stage: len(questions[stage]) for stage in STAGES},
            "questions_also_in_train": (
                None
                if split == "train"
                else {stage: len(questions[stage] & train_questions) for stage in STAGES}
            ),
        }
    names = {split: set(out["splits"][split]["repository_names"]) for split in SPLITS}
    out["repositories_shared_between_splits"] = {
        f"{a}&{b}": sorted(names[a] & names[b])
        for a, b in (("train", "validation"), ("train", "test"), ("validation", "test"))
    }
    return out


def format_stats(stats: dict[str, Any]) -> str:
    """A plain-text table of :func:`corpus_stats`."""
    from reflect_trl.envs.auto_explore.tasks import STAGES

    lines = [
        f"auto_explore corpus {stats['corpus']!r}: {stats['repositories']} repositories, {stats['files']} reachable "
        f"files, split_unit={stats['split_unit']!r}",
        f"{'split':10s} {'repos':>5s}  "
        + "  ".join(f"{s + ' tasks':>12s}" for s in STAGES)
        + "  "
        + "  ".join(f"{s + ' distinct':>15s}" for s in STAGES),
    ]
    for split, row in stats["splits"].items():
        lines.append(
            f"{split:10s} {row['repositories']:5d}  "
            + "  ".join(f"{row['tasks'][s]:12d}" for s in STAGES)
            + "  "
            + "  ".join(f"{row['distinct_questions'][s]:15d}" for s in STAGES)
        )
    for split, row in stats["splits"].items():
        per_stage = ", ".join(f"{s} {row['repositories_per_stage'][s]}" for s in STAGES)
        lines.append(f"{split} repositories with tasks of a stage: {per_stage}")
    for split, row in stats["splits"].items():
        if row["questions_also_in_train"] is not None:
            shared = ", ".join(f"{s} {row['questions_also_in_train'][s]}" for s in STAGES)
            lines.append(f"{split} question texts also asked in train: {shared}")
    shared = {k: v for k, v in stats["repositories_shared_between_splits"].items() if v}
    lines.append(
        "repositories shared between splits: "
        + ("none" if not shared else "; ".join(f"{k}: {len(v)}" for k, v in shared.items()))
    )
    for split, row in stats["splits"].items():
        lines.append(f"{split} repositories: {', '.join(row['repository_names'])}")
    return "\n".join(lines)


DESCRIPTION = (
    "print the AutoExplore corpus statistics: repositories per split, tasks and distinct questions per split and "
    f"stage (the 'packages' corpus needs {INSTALL_COMMAND})"
)


def corpus_stats_cli(argv: Sequence[str] | None = None) -> None:
    """``reflect-trl corpus-stats`` / ``python -m reflect_trl.envs.auto_explore``."""
    parser = argparse.ArgumentParser(prog="reflect-trl corpus-stats", description=DESCRIPTION)
    parser.add_argument(
        "--corpus",
        default="packages",
        choices=("packages", "default"),
        help="'packages' (the pinned extra, split by repository) or 'default' (trl, peft, datasets, accelerate)",
    )
    parser.add_argument(
        "--horizon", type=int, default=15, help="episode horizon (deeper targets are left out)"
    )
    parser.add_argument("--max_tasks_per_file", type=int, default=3, help="questions kept per file at most")
    parser.add_argument("--json", action="store_true", help="print the statistics as JSON instead of a table")
    args = parser.parse_args(argv)
    stats = corpus_stats(args.corpus, horizon=args.horizon, max_tasks_per_file=args.max_tasks_per_file)
    print(json.dumps(stats, indent=2) if args.json else format_stats(stats))
