"""AutoExplore tasks: questions whose answer is one file of the corpus, derived from the code itself.

The built-in :class:`CodeQuestionSource` reads every reachable corpus file and proposes *candidates*:

* Python modules (parsed with :mod:`ast`, never imported): public top-level classes, functions and
  UPPER_CASE constants by name ("Where is the function `foo` implemented?"), and classes/functions by the
  first sentence of their docstring ('Which file defines the class described as "..."?');
* Markdown / reStructuredText: section headings;
* YAML / JSON: top-level ``key: scalar`` settings ("Which config file sets `x` to `y`?");
* any other file with no candidate: its (repository-unique) name.

A candidate is kept only if its key (the name, the docstring summary, the heading, the setting) occurs in
exactly one file of the repository, so each question has one answer. At most ``max_per_file`` candidates
are kept per file (round-robin over kinds, ranked by a stable hash). Everything is a pure function of the
corpus: the same corpus gives the same tasks, in the same order.

**Record** (``Task.data``): ``question``, ``repo``, ``targets`` (repository paths; several files may be
accepted), ``optimal_path`` (``["cd d1", "cd d2", "cat f", "id f"]``), ``depth`` (directories above the
target), ``kind``, ``topic`` (a short noun phrase for reflections), ``split``.

**Stages** (the depth curriculum, a task's ``difficulty``): ``depth1`` (depth <= 1), ``depth2`` (2),
``depth3`` (3 and deeper).

**Splits.** Each task is assigned to ``train`` / ``validation`` / ``test`` (70/20/10) by a stable hash of
its *target file* (``split_unit="file"``, the default: no test file is ever a training target) or of the
question (``split_unit="question"``, the paper's per-query split), or (60/20/20) by a stable hash of its
*repository* name alone (``split_unit="repo"``, :func:`repo_split`: every task of a repository is in one split,
so no test repository is ever seen in training; the ``packages`` corpus uses it). The assignment does not depend
on any seed, so splits are disjoint whatever seeds ``make_tasks`` gets. The held-out-repository split is
:func:`holdout_split` (used by ``AutoExploreEnv(holdout_repos=[...])``).

**Teacher hook.** Any object with ``candidates(tree, path, text) -> list[Candidate]`` (the
:class:`QuestionSource` protocol) can be passed to :func:`generate_tasks` via ``sources=``; a teacher-LLM
source would return ``Candidate(kind="teacher", key=<question>, topic=..., question=...)``. Save the result
with :func:`save_tasks` and point the environment at it with ``tasks_file=``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from reflect_trl.envs.auto_explore.corpus import Corpus, RepoTree, file_kind
from reflect_trl.envs.auto_explore.sandbox import RepoSandbox, SandboxError, quote_name
from reflect_trl.envs.base import SPLITS, Task

ENV_NAME = "auto_explore"
STAGES: tuple[str, ...] = ("depth1", "depth2", "depth3")
SPLIT_WEIGHTS: tuple[float, float, float] = (0.7, 0.2, 0.1)
#: Whole repositories are coarse units: a larger held-out share keeps enough of them in validation and test.
REPO_SPLIT_WEIGHTS: tuple[float, float, float] = (0.6, 0.2, 0.2)
SPLIT_UNITS = ("file", "question", "repo")
REQUIRED_DATA_FIELDS = ("question", "repo", "targets")
#: Question generation reads whole files (the corpus filter already caps their size well below this).
READ_WHOLE_FILE_BYTES = 4_000_000


def stage_of_depth(depth: int) -> str:
    """The curriculum stage of a target at ``depth`` directories below the root."""
    return STAGES[min(max(depth, 1), 3) - 1]


def depth_of(path: str) -> int:
    return path.count("/")


def optimal_path(target: str) -> list[str]:
    """The shortest command sequence from the root that opens and identifies ``target``."""
    *dirs, name = target.split("/")
    return [f"cd {quote_name(d)}" for d in dirs] + [f"cat {quote_name(name)}", f"id {quote_name(name)}"]


def _stable_unit(text: str) -> float:
    return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16) / float(16**12)


def _stable_key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _split_of(u: float, weights: tuple[float, float, float]) -> str:
    if u < weights[0]:
        return "train"
    if u < weights[0] + weights[1]:
        return "validation"
    return "test"


def repo_split(repo: str) -> str:
    """The split of a whole repository (``split_unit="repo"``): a stable hash of its name, 60/20/20; it depends on
    no seed and on no other repository."""
    return _split_of(_stable_unit(f"auto_explore-repo-split|{repo}"), REPO_SPLIT_WEIGHTS)


def assign_split(repo: str, target: str, question: str, split_unit: str = "file") -> str:
    """The split of a task (a pure function of its repository and, per unit, target file and question)."""
    if split_unit not in SPLIT_UNITS:
        raise ValueError(f"auto_explore: split_unit must be one of {SPLIT_UNITS}, got {split_unit!r}")
    if split_unit == "repo":
        return repo_split(repo)
    group = f"{repo}|{target}" if split_unit == "file" else f"{repo}|{target}|{question}"
    return _split_of(_stable_unit(f"auto_explore-split|{group}"), SPLIT_WEIGHTS)


# -- candidates --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    """A question about one file. ``key`` must be unique in the repository for the question to be kept."""

    kind: str
    key: str
    topic: str
    question: str


class QuestionSource(Protocol):
    """Proposes questions about one corpus file (the hook for teacher-LLM questions)."""

    def candidates(self, tree: RepoTree, path: str, text: str) -> list[Candidate]: ...


_TEMPLATES: dict[str, tuple[str, ...]] = {
    "class_name": (
        "Which file defines the class `{name}`?",
        "Where is the class `{name}` implemented?",
        "Find the file that contains the definition of class `{name}`.",
    ),
    "function_name": (
        "Where is the function `{name}` implemented?",
        "Which file defines the function `{name}`?",
        "I need the source code of `{name}()`. Which file is it in?",
    ),
    "constant": (
        "Which file defines the constant `{name}`?",
        "Where is the module-level constant `{name}` set?",
    ),
    "class_doc": (
        'Which file defines the class described as "{summary}"?',
        'Find the class documented as "{summary}". Which file is it in?',
    ),
    "function_doc": (
        'Which file defines the function described as "{summary}"?',
        'Where is the function whose documentation says "{summary}"?',
    ),
    "heading": (
        'Which document has a section titled "{heading}"?',
        'Where can I read the "{heading}" section?',
    ),
    "config_key": (
        "Which configuration file sets `{key}` to `{value}`?",
        "Find the config file where `{key}` is `{value}`.",
    ),
    "file_name": (
        "Find the file named `{name}`.",
        "Where is the file `{name}` located?",
    ),
}

_ROLE = re.compile(r":[a-zA-Z_:]+:`~?([^`]+)`")
_DOC_LINK = re.compile(r"\[`~?([^`\]]+)`\]")
_MD_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_WS = re.compile(r"\s+")
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)\]`])[.!?](\s|$)")


def _pick_template(kind: str, seed_text: str) -> str:
    options = _TEMPLATES[kind]
    return options[int(_stable_key(f"{kind}|{seed_text}")[:8], 16) % len(options)]


def docstring_summary(doc: str | None, min_words: int = 4, max_words: int = 30) -> str | None:
    """The first sentence of a docstring, cleaned of reST roles and markup; None if unusable."""
    if not doc:
        return None
    para = doc.strip().split("\n\n", 1)[0]
    para = _ROLE.sub(r"`\1`", para)
    para = _DOC_LINK.sub(r"`\1`", para)
    para = _MD_LINK.sub(r"\1", para)
    para = _WS.sub(" ", para.replace("``", "`")).strip()
    match = _SENTENCE_END.search(para)
    sentence = para[: match.start()] if match else para
    sentence = sentence.strip().rstrip(".:;,")
    words = sentence.split()
    if not (min_words <= len(words) <= max_words) or '"' in sentence or not sentence.isascii():
        return None
    if sentence.lower().startswith(("todo", "deprecated", "copied from", "see ", "alias", "args", "example")):
        return None
    return sentence


def _short(text: str, max_words: int = 10) -> str:
    words = text.split()
    return " ".join(words[:max_words]) + (" ..." if len(words) > max_words else "")


def _python_candidates(text: str) -> list[Candidate]:
    try:
        module = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return []
    out: list[Candidate] = []
    for node in module.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            if node.name.startswith("_"):
                continue
            what = "class" if isinstance(node, ast.ClassDef) else "function"
            name = node.name
            out.append(
                Candidate(
                    kind=f"{what}_name",
                    key=f"def:{name}",
                    topic=f"the {what} `{name}`",
                    question=_pick_template(f"{what}_name", name).format(name=name),
                )
            )
            summary = docstring_summary(ast.get_docstring(node))
            if summary:
                out.append(
                    Candidate(
                        kind=f"{what}_doc",
                        key=f"doc:{summary.lower()}",
                        topic=f'the {what} "{_short(summary, 6)}"',
                        question=_pick_template(f"{what}_doc", summary).format(summary=summary),
                    )
                )
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Name)
                    and len(target.id) >= 4
                    and target.id.isupper()
                    and not target.id.startswith("_")
                ):
                    out.append(
                        Candidate(
                            kind="constant",
                            key=f"def:{target.id}",
                            topic=f"the constant `{target.id}`",
                            question=_pick_template("constant", target.id).format(name=target.id),
                        )
                    )
    return out


_MD_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
_RST_UNDERLINE = re.compile(r"^([=\-~^*+#\"'`])\1{2,}\s*$")
_MARKUP = re.compile(r"[`*_\[\]]|<[^>]*>|\(http[^)]*\)")


def _clean_heading(text: str) -> str | None:
    text = _WS.sub(" ", _MARKUP.sub("", text)).strip().rstrip(":")
    words = text.split()
    if not (2 <= len(words) <= 12) or '"' in text or not text.isascii() or not any(c.isalpha() for c in text):
        return None
    return text


def _heading_candidates(text: str, suffix: str) -> list[Candidate]:
    headings: list[str] = []
    lines = text.splitlines()
    in_fence = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        if suffix == ".md":
            match = _MD_HEADING.match(line)
            if match:
                headings.append(match.group(1))
        elif (
            suffix == ".rst"
            and i + 1 < len(lines)
            and line.strip()
            and _RST_UNDERLINE.match(lines[i + 1])
            and len(lines[i + 1].strip()) >= len(line.strip())
        ):
            headings.append(line.strip())
    out = []
    for raw in headings:
        heading = _clean_heading(raw)
        if heading:
            out.append(
                Candidate(
                    kind="heading",
                    key=f"heading:{heading.lower()}",
                    topic=f'the section "{_short(heading, 8)}"',
                    question=_pick_template("heading", heading).format(heading=heading),
                )
            )
    return out


def _config_candidates(text: str, suffix: str) -> list[Candidate]:
    try:
        if suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception:  # any parse failure (invalid JSON/YAML, templated YAML): no config questions
        return []
    if not isinstance(data, dict):
        return []
    out = []
    for key, value in data.items():
        if not isinstance(key, str) or not key.isascii() or len(key) > 40 or "`" in key:
            continue
        if isinstance(value, bool):
            shown = "true" if value else "false"
        elif isinstance(value, int | float | str):
            shown = str(value)
        else:
            continue
        if not shown or len(shown) > 40 or "`" in shown or "\n" in shown or not shown.isascii():
            continue
        out.append(
            Candidate(
                kind="config_key",
                key=f"config:{key}={shown}",
                topic=f"the setting `{key}: {shown}`",
                question=_pick_template("config_key", f"{key}={shown}").format(key=key, value=shown),
            )
        )
    return out


class CodeQuestionSource:
    """Questions derived from the file itself (definitions, docstrings, headings, settings)."""

    def candidates(self, tree: RepoTree, path: str, text: str) -> list[Candidate]:
        suffix = os.path.splitext(path)[1].lower()
        if suffix == ".py":
            return _python_candidates(text)
        if suffix in (".md", ".rst"):
            return _heading_candidates(text, suffix)
        if suffix in (".json", ".yaml", ".yml"):
            return _config_candidates(text, suffix)
        return []


def _file_name_candidate(path: str) -> Candidate:
    name = path.rsplit("/", 1)[-1]
    return Candidate(
        kind="file_name",
        key=f"file:{name}",
        topic=f"the file `{name}`",
        question=_pick_template("file_name", path).format(name=name),
    )


def _select(cands: list[Candidate], path: str, max_per_file: int) -> list[Candidate]:
    """Round-robin over kinds (kind order and order within a kind by stable hash)."""
    by_kind: dict[str, list[Candidate]] = defaultdict(list)
    for cand in cands:
        by_kind[cand.kind].append(cand)
    queues = [
        sorted(items, key=lambda c: _stable_key(f"{path}|{c.key}"))
        for _, items in sorted(by_kind.items(), key=lambda kv: _stable_key(f"{path}|{kv[0]}"))
    ]
    out: list[Candidate] = []
    while len(out) < max_per_file and any(queues):
        for queue in queues:
            if queue and len(out) < max_per_file:
                out.append(queue.pop(0))
    return out


def generate_repo_tasks(
    tree: RepoTree,
    *,
    sources: Sequence[QuestionSource] | None = None,
    max_per_file: int = 3,
    split_unit: str = "file",
) -> list[Task]:
    """All tasks of one repository (sorted by target, then question); ``seed`` is 0 (set by make_tasks)."""
    sources = list(sources) if sources is not None else [CodeQuestionSource()]
    sandbox = RepoSandbox(tree, max_read_bytes=READ_WHOLE_FILE_BYTES)
    per_file: dict[str, list[Candidate]] = {}
    key_files: dict[str, set[str]] = defaultdict(set)
    files = tree.walk_files()
    for path in files:
        try:
            text = sandbox.read(path)
        except SandboxError:
            continue
        cands = [c for source in sources for c in source.candidates(tree, path, text)]
        unique: dict[str, Candidate] = {}
        for cand in cands:
            unique.setdefault(cand.key, cand)
        per_file[path] = list(unique.values())
        for key in unique:
            key_files[key].add(path)
    name_count: dict[str, int] = defaultdict(int)
    for path in files:
        name_count[path.rsplit("/", 1)[-1]] += 1
    tasks: list[Task] = []
    for path in files:
        kept = [c for c in per_file.get(path, []) if len(key_files[c.key]) == 1]
        if not kept and name_count[path.rsplit("/", 1)[-1]] == 1 and file_kind(path) != "other":
            kept = [_file_name_candidate(path)]
        for cand in sorted(_select(kept, path, max_per_file), key=lambda c: c.question):
            depth = depth_of(path)
            digest = _stable_key(f"{tree.name}|{path}|{cand.question}")[:10]
            tasks.append(
                Task(
                    env=ENV_NAME,
                    task_id=f"{tree.name}:{path}:{cand.kind}:{digest}",
                    difficulty=stage_of_depth(depth),
                    seed=0,
                    data={
                        "question": cand.question,
                        "repo": tree.name,
                        "targets": [path],
                        "optimal_path": optimal_path(path),
                        "depth": depth,
                        "kind": cand.kind,
                        "topic": cand.topic,
                        "split": assign_split(tree.name, path, cand.question, split_unit),
                    },
                )
            )
    return tasks


def generate_tasks(
    corpus: Corpus,
    *,
    sources: Sequence[QuestionSource] | None = None,
    max_per_file: int = 3,
    split_unit: str = "file",
) -> list[Task]:
    """All tasks of every repository of the corpus (repositories in name order)."""
    tasks: list[Task] = []
    for name in corpus.names:
        tasks.extend(
            generate_repo_tasks(
                corpus.repo(name), sources=sources, max_per_file=max_per_file, split_unit=split_unit
            )
        )
    return tasks


def holdout_split(tasks: Iterable[Task], holdout_repos: Iterable[str]) -> dict[str, list[Task]]:
    """The held-out-repository split: ``train``/``validation`` keep their tasks from the other
    repositories, ``test`` is *every* task of the held-out repositories (their ``data["split"]`` becomes
    ``"test"``). The other repositories' own test tasks are left out."""
    held = set(holdout_repos)
    out: dict[str, list[Task]] = {split: [] for split in SPLITS}
    for task in tasks:
        if task.data["repo"] in held:
            out["test"].append(replace(task, data={**task.data, "split": "test"}))
        elif task.data.get("split") in ("train", "validation"):
            out[task.data["split"]].append(task)
    return out


# -- persistence -------------------------------------------------------------------------------------------
def save_tasks(path: str | os.PathLike[str], tasks: Iterable[Task]) -> Path:
    """Write tasks as JSON Lines of ``Task.to_dict()``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for task in tasks:
            fh.write(json.dumps(task.to_dict(), sort_keys=True) + "\n")
    return path


def validate_task_record(record: Any, where: str) -> Task:
    """A :class:`Task` from one decoded record; ``ValueError`` names ``where`` and the bad field."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for key in ("env", "task_id", "difficulty", "seed"):
        if key not in record:
            raise ValueError(f"{where}: missing field {key!r}")
    if record["env"] != ENV_NAME:
        raise ValueError(f"{where}: field 'env' is {record['env']!r}, expected {ENV_NAME!r}")
    if record["difficulty"] not in STAGES:
        raise ValueError(
            f"{where}: field 'difficulty' is {record['difficulty']!r}, expected one of {list(STAGES)}"
        )
    if not isinstance(record["seed"], int) or isinstance(record["seed"], bool):
        raise ValueError(f"{where}: field 'seed' must be an integer, got {record['seed']!r}")
    data = record.get("data")
    if not isinstance(data, dict):
        raise ValueError(f"{where}: field 'data' must be an object")
    for key in REQUIRED_DATA_FIELDS:
        if key not in data:
            raise ValueError(f"{where}: missing field 'data.{key}'")
    if not isinstance(data["question"], str) or not data["question"].strip():
        raise ValueError(f"{where}: field 'data.question' must be a non-empty string")
    if not isinstance(data["repo"], str) or not data["repo"]:
        raise ValueError(f"{where}: field 'data.repo' must be a non-empty string")
    targets = data["targets"]
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise ValueError(f"{where}: field 'data.targets' must be a non-empty list of paths, got {targets!r}")
    for target in targets:
        parts = target.split("/")
        if target.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in target:
            raise ValueError(f"{where}: field 'data.targets' has an invalid repository path {target!r}")
    split = data.get("split")
    if split is not None and split not in SPLITS:
        raise ValueError(f"{where}: field 'data.split' is {split!r}, expected one of {list(SPLITS)}")
    depth = min(depth_of(t) for t in targets)
    data = {
        "depth": depth,
        "kind": "custom",
        "topic": "the file that answers the question",
        "optimal_path": optimal_path(min(targets, key=lambda t: (depth_of(t), t))),
        **data,
    }
    return Task.from_dict({**record, "data": data})


def load_tasks(path: str | os.PathLike[str]) -> list[Task]:
    """Read a JSONL task file written by :func:`save_tasks` (errors name the file, line and field)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"auto_explore task file {str(path)!r} does not exist")
    tasks: list[Task] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
            task = validate_task_record(record, where)
            if task.task_id in seen:
                raise ValueError(f"{where}: field 'task_id' repeats an earlier task: {task.task_id!r}")
            seen.add(task.task_id)
            tasks.append(task)
    return tasks


def task_card(tasks: Iterable[Task]) -> dict[str, Any]:
    """Counts of tasks per repository, split, stage, depth and kind (for a data-set card)."""
    card: dict[str, Any] = {
        "total": 0,
        "by_repo": {},
        "by_split": {},
        "by_stage": {},
        "by_depth": {},
        "by_kind": {},
    }
    for task in tasks:
        card["total"] += 1
        for field, value in (
            ("by_repo", task.data.get("repo")),
            ("by_split", task.data.get("split")),
            ("by_stage", task.difficulty),
            ("by_depth", str(task.data.get("depth"))),
            ("by_kind", task.data.get("kind")),
        ):
            card[field][value] = card[field].get(value, 0) + 1
    for field in ("by_repo", "by_split", "by_stage", "by_depth", "by_kind"):
        card[field] = dict(sorted(card[field].items(), key=lambda kv: str(kv[0])))
    return card
