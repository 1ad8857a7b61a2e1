"""AutoExplore: find the file of a repository that answers a question, by ``cd``/``cat``/``id`` commands.

Reflect-RL's repository-navigation benchmark (method notes, sections 2.2, 4.1, 5 and 9) over real code: by
default the source trees of the installed ``trl``, ``peft``, ``datasets`` and ``accelerate`` packages
(:mod:`.corpus`), with questions derived from the code (:mod:`.tasks`), executed by a pure-Python,
read-only sandbox (:mod:`.sandbox`).

**Corpora** (``corpus=``): ``"default"`` -- ``roots`` (directories or installed packages), or those four packages
when ``roots`` is None; ``"packages"`` -- many small real code bases pinned as the optional extra
``auto-explore-corpus`` (:mod:`.packages`; ``pip install -e '.[auto-explore-corpus]'``), one repository per
package, whole repositories assigned to ``train`` / ``validation`` / ``test`` (``split_unit="repo"``), so ``test``
measures navigation in code bases never seen in training.

**Actions** (for the current directory, in this order): ``cd ..`` (not at the root), ``cd <dir>`` for each
subdirectory, then ``cat <file>`` and ``id <file>`` for each file; names sorted, odd names quoted. ``cat``
of a file already opened in this episode is not offered again (``filter_catted=True``, as in the paper).
A directory never yields more than ``max_options`` actions (see :mod:`.corpus` for the pruning rule).

**Observation** (no options: the shared prompt builder renders them)::

    # Task
    <question>
    # Current working directory
    <"./" at the root, else "trl/trainer/">
    # Files under current working directory
    <entries, directories with a trailing "/">
    # Command history
    <commands so far, or "(none)">
    # Execution result of your last command
    <"Executing: <cmd>" + "Success: ..." / "Error: ...", or "(none)">

``cat`` output is truncated by the policy model's tokenizer (``tokenizer_name_or_path``, a local
directory) to ``max_content_lines`` lines / ``max_content_tokens`` tokens (whitespace words without a
tokenizer).

**Episode.** Horizon 15 by default. ``id`` of any file ends the episode: success iff it is a target;
a wrong ``id`` is a failure. Reaching the horizon without an ``id`` is a failure (``truncated``).
``info["success"]`` is set on every step (False until a successful ``id``).

**Cost table** (method notes section 9; reward = -cost / H, so returns are O(1)):

============================== ============ ===================
event                          cost         reward (H = 15)
============================== ============ ===================
every step (``step_cost``)     1            -1/H  = -0.067
refused command ("invalid")    +2           -2/H  = -0.133
``id`` of a target (success)   -H           +1
wrong ``id`` or horizon hit    +H           -1
============================== ============ ===================

Each event is counted once (the reference code counted "Error"/"Warning" keywords twice and also inside
file contents; here nothing depends on text). A successful episode of k steps returns ``(H - k) / H`` in
[0, 1); a failed one ``-1 - k / H``. Refused commands cannot come from the enumerated actions; they are
kept in the table for completeness (e.g. a file removed while the corpus is in use).

**Leave-out** (training augmentation): with ``leaveout_prob`` > 0, every entry that is not on the way to a
target is hidden with that probability, drawn from the episode seed and the directory (a directory looks
the same each time it is visited within an episode). 0 (the default) for evaluation.

**State key** (:meth:`AutoExploreEnv.state_key`, for state-grouped advantages): task, working directory, files
already opened (when they filter the options), the leave-out seed (when leave-out is on); not the command history
nor the last command's result.

**Splits.** ``make_tasks(split, ...)`` draws from the split of :mod:`.tasks`: per file, 70/20/10, for the
``default`` corpus; per repository, 60/20/20, for ``packages`` (``split_unit`` chooses explicitly). With
``holdout_repos=[...]``, ``train``/``validation`` use the other repositories only and ``test`` is every
task of the held-out repositories (generalisation to an unseen code base). ``tasks_file`` replaces the
generated tasks by a JSONL file (:func:`.tasks.save_tasks`); records without ``data.split`` get the
hash split.
"""

from __future__ import annotations

import logging
import os
import random
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from reflect_trl.envs.auto_explore.content import load_tokenizer, truncate_content
from reflect_trl.envs.auto_explore.corpus import (
    DEFAULT_MAX_OPTIONS,
    Corpus,
    Listing,
    RepoTree,
    corpus_card,
    join_rel,
    load_corpus,
)
from reflect_trl.envs.auto_explore.packages import load_package_corpus
from reflect_trl.envs.auto_explore.sandbox import RepoSandbox, display_dir, quote_name
from reflect_trl.envs.auto_explore.tasks import (
    SPLIT_UNITS,
    STAGES,
    assign_split,
    generate_tasks,
    holdout_split,
    load_tasks,
    task_card,
)
from reflect_trl.envs.base import SPLITS, Observation, StepResult, Task, TextEnv, split_seed

logger = logging.getLogger(__name__)

STEP_COST = 1.0
INVALID_COST = 2.0
NO_ENTRIES = "(empty)"
NO_HISTORY = "(none)"
NO_RESULT = "(none)"
#: The corpora ``AutoExploreEnv(corpus=...)`` knows (see the module docstring).
CORPORA: tuple[str, ...] = ("default", "packages")

_POOL_CACHE: dict[Any, Any] = {}
_POOL_LOCK = threading.Lock()


@dataclass(frozen=True)
class StepRecord:
    """What one step did (used by the oracle reflector): the command, where it ran, how far the nearest
    target was before and after (in commands)."""

    command: str
    verb: str | None
    path: str | None
    ok: bool
    cwd_before: str
    cwd_after: str
    distance_before: int
    distance_after: int

    @property
    def helped(self) -> bool:
        return self.distance_after < self.distance_before


class _Shared:
    """Read-only state shared by an env and its clones: sandboxes and the truncated-content cache."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sandboxes: dict[str, RepoSandbox] = {}
        self.contents: dict[tuple[str, str], str] = {}


class AutoExploreEnv(TextEnv):
    """Repository navigation over real code (see the module docstring for the full specification)."""

    name = "auto_explore"
    stages = STAGES
    # the leave-out never hides the path to the target, so it would tell an evaluation where the target is
    training_only_kwargs = ("leaveout_prob",)

    def __init__(
        self,
        horizon: int = 15,
        roots: str | Sequence[str] | Mapping[str, str] | None = None,
        tasks_file: str | None = None,
        leaveout_prob: float = 0.0,
        tokenizer_name_or_path: str | None = None,
        max_content_tokens: int = 120,
        max_content_lines: int = 20,
        max_options: int = DEFAULT_MAX_OPTIONS,
        holdout_repos: Sequence[str] | None = None,
        split_unit: str | None = None,
        max_tasks_per_file: int = 3,
        filter_catted: bool = True,
        seed: int = 0,
        step_cost: float = STEP_COST,
        corpus: str = "default",
    ) -> None:
        super().__init__(horizon=horizon)
        if step_cost < 0:
            raise ValueError(f"auto_explore: step_cost must be >= 0, got {step_cost}")
        # The cost table's 1 per step makes a quick wrong `id` (-1 - 2/H) cheaper than a long search that fails
        # (-2): a policy that rarely succeeds learns to answer at once. step_cost=0 removes that incentive (RL only).
        self.step_cost = float(step_cost)
        if not 0.0 <= leaveout_prob < 1.0:
            raise ValueError(f"auto_explore: leaveout_prob must be in [0, 1), got {leaveout_prob}")
        if max_content_tokens < 1 or max_content_lines < 1:
            raise ValueError("auto_explore: max_content_tokens and max_content_lines must be >= 1")
        if corpus not in CORPORA:
            raise ValueError(f"auto_explore: corpus must be one of {CORPORA}, got {corpus!r}")
        if corpus == "packages" and roots is not None:
            raise ValueError(
                "auto_explore: corpus='packages' is the pinned package corpus; it takes no roots "
                "(use corpus='default' with roots for your own directories or packages)"
            )
        self.corpus_name = corpus
        if isinstance(roots, Mapping):
            roots = dict(roots)
        elif roots is not None and not isinstance(roots, str):
            roots = list(roots)
        self.roots = roots
        self.tasks_file = None if tasks_file is None else os.fspath(tasks_file)
        self.leaveout_prob = float(leaveout_prob)
        self.tokenizer_name_or_path = tokenizer_name_or_path
        self.max_content_tokens = int(max_content_tokens)
        self.max_content_lines = int(max_content_lines)
        self.max_options = int(max_options)
        if isinstance(holdout_repos, str):
            holdout_repos = [holdout_repos]
        self.holdout_repos = tuple(sorted(holdout_repos or ()))
        if split_unit is None:
            split_unit = "repo" if corpus == "packages" else "file"
        if split_unit not in SPLIT_UNITS:
            raise ValueError(f"auto_explore: split_unit must be one of {SPLIT_UNITS}, got {split_unit!r}")
        if corpus == "packages" and split_unit != "repo":
            raise ValueError(
                f"auto_explore: corpus='packages' assigns whole repositories to splits (split_unit='repo'), so that "
                f"no test repository is seen in training; got split_unit={split_unit!r}"
            )
        self.split_unit = split_unit
        self.max_tasks_per_file = int(max_tasks_per_file)
        self.filter_catted = bool(filter_catted)
        self.seed = int(seed)
        self._shared = _Shared()
        self._corpus: Corpus | None = None
        self._tokenizer: Any = None
        self._tokenizer_loaded = False
        self._reset_episode_state()

    def _reset_episode_state(self) -> None:
        self.repo: RepoTree | None = None
        self.targets: tuple[str, ...] = ()
        self.cwd = ""
        self.history: list[str] = []
        self.catted: set[str] = set()
        self.trace: list[StepRecord] = []
        self.last_message = ""
        self.identified: str | None = None
        self.success = False
        self.episode_seed = 0
        self._listings: dict[str, Listing] = {}

    # -- shared resources ------------------------------------------------------------------------------
    @property
    def corpus(self) -> Corpus:
        if self._corpus is None:
            if self.corpus_name == "packages":
                self._corpus = load_package_corpus(max_options=self.max_options)
            else:
                self._corpus = load_corpus(self.roots, max_options=self.max_options)
            unknown = sorted(set(self.holdout_repos) - set(self._corpus.repos))
            if unknown:
                raise ValueError(
                    f"auto_explore: holdout_repos {unknown} are not in the corpus {self._corpus.names}"
                )
        return self._corpus

    @property
    def tokenizer(self) -> Any:
        if not self._tokenizer_loaded:
            self._tokenizer = load_tokenizer(self.tokenizer_name_or_path)
            self._tokenizer_loaded = True
        return self._tokenizer

    def sandbox(self, repo: str) -> RepoSandbox:
        with self._shared.lock:
            if repo not in self._shared.sandboxes:
                self._shared.sandboxes[repo] = RepoSandbox(
                    self.corpus.repo(repo),
                    format_content=lambda rel, text, r=repo: self._format(r, rel, text),
                )
            return self._shared.sandboxes[repo]

    def _format(self, repo: str, rel: str, text: str) -> str:
        key = (repo, rel)
        with self._shared.lock:
            if key in self._shared.contents:
                return self._shared.contents[key]
        shown = truncate_content(
            text,
            rel,
            max_lines=self.max_content_lines,
            max_tokens=self.max_content_tokens,
            tokenizer=self.tokenizer,
        )
        with self._shared.lock:
            self._shared.contents[key] = shown
        return shown

    # -- tasks -----------------------------------------------------------------------------------------
    def _pool_key(self) -> tuple:
        corpus = self.corpus
        tasks_file = None
        if self.tasks_file is not None:
            stat = os.stat(self.tasks_file)
            tasks_file = (os.path.realpath(self.tasks_file), stat.st_mtime_ns, stat.st_size)
        return (
            id(corpus),
            tasks_file,
            self.holdout_repos,
            self.split_unit,
            self.max_tasks_per_file,
            self.horizon,
        )

    def task_pools(self) -> dict[str, dict[str, list[Task]]]:
        """Every distinct task, per split and stage (deterministic order). Shared per process."""
        key = self._pool_key()
        with _POOL_LOCK:
            if key not in _POOL_CACHE:
                _POOL_CACHE[key] = self._build_pools()
            return _POOL_CACHE[key]

    def _generated_tasks(self) -> list[Task]:
        """Every task generated from the corpus (before the horizon filter and the held-out split)."""
        key = ("generated", id(self.corpus), self.max_tasks_per_file, self.split_unit)
        if key not in _POOL_CACHE:  # called under _POOL_LOCK
            _POOL_CACHE[key] = generate_tasks(  # type: ignore[assignment]
                self.corpus, max_per_file=self.max_tasks_per_file, split_unit=self.split_unit
            )
        return _POOL_CACHE[key]  # type: ignore[return-value]

    def _build_pools(self) -> dict[str, dict[str, list[Task]]]:
        if self.tasks_file is not None:
            tasks = [self._checked_loaded_task(task) for task in load_tasks(self.tasks_file)]
        else:
            tasks = self._generated_tasks()
        too_deep = [t for t in tasks if int(t.data["depth"]) + 2 > self.horizon]
        if too_deep:
            logger.warning(
                "auto_explore: %d task(s) need more than horizon=%d steps and are left out (e.g. %s)",
                len(too_deep),
                self.horizon,
                too_deep[0].task_id,
            )
        tasks = [t for t in tasks if int(t.data["depth"]) + 2 <= self.horizon]
        if self.holdout_repos:
            by_split = holdout_split(tasks, self.holdout_repos)
        else:
            by_split = {split: [t for t in tasks if t.data["split"] == split] for split in SPLITS}
        return {
            split: {stage: [t for t in by_split[split] if t.difficulty == stage] for stage in STAGES}
            for split in SPLITS
        }

    def _checked_loaded_task(self, task: Task) -> Task:
        where = f"{self.tasks_file}: task {task.task_id!r}"
        repo = task.data["repo"]
        if repo not in self.corpus.repos:
            raise ValueError(f"{where}: field 'data.repo' {repo!r} is not in the corpus {self.corpus.names}")
        tree = self.corpus.repo(repo)
        for target in task.data["targets"]:
            if not tree.is_file(target):
                raise ValueError(f"{where}: target {target!r} is not a corpus file of repository {repo!r}")
        if "split" not in task.data:
            split = assign_split(repo, task.data["targets"][0], task.data["question"], self.split_unit)
            task = replace(task, data={**task.data, "split": split})
        return task

    def task_pool(self, split: str, difficulty: str | None = None) -> list[Task]:
        """The distinct tasks of a split (one stage, or all stages in stage order)."""
        if split not in SPLITS:
            raise ValueError(f"auto_explore: unknown split {split!r}; expected one of {SPLITS}")
        pools = self.task_pools()[split]
        if difficulty is not None:
            return list(pools[self.check_difficulty(difficulty)])
        return [t for stage in STAGES for t in pools[stage]]

    def make_tasks(self, split: str, n: int, seed: int = 0, difficulty: str | None = None) -> list[Task]:
        """``n`` tasks of ``split``: a seeded shuffle of the distinct tasks (see :meth:`task_pool`), repeated
        in fresh shuffles if ``n`` exceeds their number (repeats get a ``@r<k>`` id suffix). ``difficulty``
        None cycles over the non-empty stages. Task ``i`` gets seed ``split_seed(seed, split, i)``."""
        if n < 0:
            raise ValueError(f"auto_explore: number of tasks must be >= 0, got {n}")
        if split not in SPLITS:
            raise ValueError(f"auto_explore: unknown split {split!r}; expected one of {SPLITS}")
        stages = [self.check_difficulty(difficulty)] if difficulty is not None else list(STAGES)
        pools = {s: self.task_pools()[split][s] for s in stages}
        stages = [s for s in stages if pools[s]]
        if not stages:
            raise ValueError(
                f"auto_explore: no {split!r} tasks of difficulty {difficulty!r} in corpus {self.corpus.names}"
                + (f" (holdout_repos={list(self.holdout_repos)})" if self.holdout_repos else "")
            )
        streams = {s: _shuffled_stream(pools[s], f"{seed}|{split}|{s}") for s in stages}
        out: list[Task] = []
        for i in range(n):
            task, rep = next(streams[stages[i % len(stages)]])
            task_id = task.task_id if rep == 0 else f"{task.task_id}@r{rep}"
            out.append(replace(task, task_id=task_id, seed=split_seed(seed, split, i)))
        return out

    # -- episode ---------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, task: Task | None = None) -> Observation:
        """Start ``task`` (or a training task drawn from ``seed``); ``seed`` overrides ``task.seed``."""
        if task is None:
            draw = self.seed if seed is None else int(seed)
            pool = self.task_pool("train")
            if not pool:
                raise ValueError(f"auto_explore: no training tasks to draw from (corpus {self.corpus.names})")
            task = replace(pool[random.Random(f"auto_explore-reset|{draw}").randrange(len(pool))], seed=draw)
        if task.env != self.name:
            raise ValueError(f"auto_explore: cannot run task {task.task_id!r} of environment {task.env!r}")
        self.check_difficulty(task.difficulty)
        repo = self.corpus.repo(str(task.data.get("repo")))
        targets = [str(t) for t in task.data.get("targets", [])]
        if not targets:
            raise ValueError(f"auto_explore: task {task.task_id!r} has no targets")
        for target in targets:
            if not repo.is_file(target):
                raise ValueError(
                    f"auto_explore: task {task.task_id!r}: target {target!r} is not in {repo.name!r}"
                )
        self._reset_episode_state()
        self.task = task
        self.repo = repo
        self.targets = tuple(targets)
        self.episode_seed = int(task.seed if seed is None else seed)
        self.t = 0
        self.done = False
        self.observation = self._observe()
        return self.observation

    @property
    def question(self) -> str:
        return str(self.task.data["question"]) if self.task else ""

    @property
    def topic(self) -> str:
        return str(self.task.data.get("topic") or "the file that answers the question") if self.task else ""

    def listing(self, rel_dir: str | None = None) -> Listing:
        """What the agent sees in a directory this episode (pruning, then leave-out; cached per episode)."""
        rel_dir = self.cwd if rel_dir is None else rel_dir
        if rel_dir not in self._listings:
            assert self.repo is not None
            listing = self.repo.listing(rel_dir, protect=self.targets)
            if self.leaveout_prob > 0:
                listing = self._leave_out(rel_dir, listing)
            self._listings[rel_dir] = listing
        return self._listings[rel_dir]

    def _leave_out(self, rel_dir: str, listing: Listing) -> Listing:
        on_path = {t for t in self.targets} | {
            "/".join(t.split("/")[:k]) for t in self.targets for k in range(1, t.count("/") + 1)
        }
        rng = random.Random(f"auto_explore-leaveout|{self.episode_seed}|{rel_dir}")

        def keep(name: str) -> bool:
            draw = rng.random()  # drawn for every entry, so the pattern only depends on the listing
            return join_rel(rel_dir, name) in on_path or draw >= self.leaveout_prob

        return Listing(
            dirs=tuple(d for d in listing.dirs if keep(d)), files=tuple(f for f in listing.files if keep(f))
        )

    def legal_actions(self) -> tuple[str, ...]:
        listing = self.listing()
        actions = [] if self.cwd == "" else ["cd .."]
        actions += [f"cd {quote_name(d)}" for d in listing.dirs]
        for name in listing.files:
            if not (self.filter_catted and join_rel(self.cwd, name) in self.catted):
                actions.append(f"cat {quote_name(name)}")
            actions.append(f"id {quote_name(name)}")
        if len(actions) > self.max_options:
            raise RuntimeError(
                f"auto_explore: {len(actions)} actions in {self.cwd!r} exceed max_options={self.max_options}"
            )
        return tuple(actions)

    def render(self) -> str:
        listing = self.listing()
        entries = [f"{quote_name(d)}/" for d in listing.dirs] + [quote_name(f) for f in listing.files]
        return "\n".join(
            [
                "# Task",
                self.question,
                "# Current working directory",
                display_dir(self.cwd),
                "# Files under current working directory",
                "\n".join(entries) or NO_ENTRIES,
                "# Command history",
                "\n".join(self.history) or NO_HISTORY,
                "# Execution result of your last command",
                self.last_message or NO_RESULT,
            ]
        )

    def _observe(self) -> Observation:
        return Observation(self.render(), self.legal_actions())

    def step(self, action_index: int) -> StepResult:
        index = self._check_action(action_index)
        assert self.repo is not None and self.observation is not None
        command = self.observation.actions[index]
        before_cwd, before_distance = self.cwd, self.oracle_distance()
        result = self.sandbox(self.repo.name).execute(self.cwd, command)
        self.t += 1
        self.history.append(command)
        self.last_message = result.message
        cost = self.step_cost
        terminated = False
        if not result.ok:
            cost += INVALID_COST
        elif result.verb == "cd":
            self.cwd = result.cwd
        elif result.verb == "cat":
            self.catted.add(str(result.path))
        elif result.verb == "id":
            self.identified = result.path
            self.success = result.path in self.targets
            terminated = True
        truncated = not terminated and self.t >= self.horizon
        if terminated or truncated:
            cost += -self.horizon if self.success else self.horizon
        self.done = terminated or truncated
        after_distance = self.oracle_distance()
        self.trace.append(
            StepRecord(
                command,
                result.verb,
                result.path,
                result.ok,
                before_cwd,
                self.cwd,
                before_distance,
                after_distance,
            )
        )
        self.observation = self._observe()
        info = {
            "success": self.success,
            "command": command,
            "ok": result.ok,
            "cwd": self.cwd,
            "identified": self.identified,
            "targets": list(self.targets),
            "cost": cost,
            "distance_to_target": after_distance,
        }
        return self.observation, -cost / self.horizon, terminated, truncated, info

    # -- Markov state ----------------------------------------------------------------------------------
    def instance_key(self, task: Task) -> str:
        """The task's id without the ``@r<k>`` suffix of a repeat: :meth:`make_tasks` cycles through a split's
        distinct tasks when asked for more (a small corpus has a handful per stage)."""
        return re.sub(r"@r\d+$", "", task.task_id)

    def state_key(self) -> tuple:
        """``(env, repo, question, targets, cwd, catted, leave-out seed, identified)``.

        * repository, question and targets: the task (two task records with the same content share keys);
        * ``cwd``: decides the listing, the legal actions and the distance to a target;
        * the files already ``cat``-ed, sorted, when ``filter_catted`` (they are no longer offered, here or in any
          directory visited later); () otherwise, as then they change neither options nor rewards;
        * the episode seed when ``leaveout_prob`` > 0 (it decides which entries of every directory are hidden, so
          episodes of one task with different seeds see different trees), None otherwise;
        * the ``id``-ed file (None until the episode ends with an ``id``).

        Left out, as history: the command list and the "last result" section. The last result is the response to
        the previous command (e.g. a file's content after ``cat``); the next command replaces it with a response
        that the state and that command decide, so it changes only the current observation, never a later one or
        a reward. Keeping it would split ``cd a`` from ``cd a; cd ..; cd a`` and from ``cat f; cd ..; cd a`` (all
        three face the same future), leaving most step groups singletons. No cost depends on history: each step
        costs the same, refused commands never come from the offered actions, and the end cost depends only on
        the ``id``-ed file."""
        if self.task is None:
            raise RuntimeError("auto_explore: state_key() called before reset()")
        return (
            self.name,
            str(self.task.data.get("repo")),
            self.question,
            self.targets,
            self.cwd,
            tuple(sorted(self.catted)) if self.filter_catted else (),
            self.episode_seed if self.leaveout_prob > 0 else None,
            self.identified,
        )

    # -- oracle ----------------------------------------------------------------------------------------
    def _plan_to(self, target: str) -> list[str]:
        here = [p for p in self.cwd.split("/") if p]
        *dirs, name = target.split("/")
        common = 0
        while common < min(len(here), len(dirs)) and here[common] == dirs[common]:
            common += 1
        plan = ["cd .."] * (len(here) - common) + [f"cd {quote_name(d)}" for d in dirs[common:]]
        if target not in self.catted:
            plan.append(f"cat {quote_name(name)}")
        plan.append(f"id {quote_name(name)}")
        return plan

    def best_target(self) -> str:
        """The target reachable in the fewest commands from here (ties: by path)."""
        return min(self.targets, key=lambda t: (len(self._plan_to(t)), t))

    def oracle_plan(self) -> list[str]:
        """The commands of a shortest path from the current state to a successful ``id``."""
        return self._plan_to(self.best_target())

    def oracle_distance(self) -> int:
        return len(self.oracle_plan())

    def oracle_command(self) -> str:
        return self.oracle_plan()[0]

    def oracle_action(self) -> int:
        if self.observation is None:
            raise RuntimeError("auto_explore: oracle_action() before reset()")
        command = self.oracle_command()
        try:
            return self.observation.actions.index(command)
        except ValueError:  # a target's path is always visible; this would be a bug
            raise RuntimeError(
                f"auto_explore: oracle command {command!r} is not among the actions {self.observation.actions}"
            ) from None

    # -- copies ----------------------------------------------------------------------------------------
    def clone(self) -> AutoExploreEnv:
        """An independent copy of the episode; the corpus, sandboxes, tokenizer and caches are shared."""
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin.history = list(self.history)
        twin.catted = set(self.catted)
        twin.trace = list(self.trace)
        twin._listings = dict(self._listings)
        return twin

    def __deepcopy__(self, memo: dict) -> AutoExploreEnv:
        return self.clone()

    def __getstate__(self) -> dict[str, Any]:
        """Pickle only settings and episode state; the corpus, tokenizer and caches are rebuilt (and
        shared per process) on the other side."""
        state = dict(self.__dict__)
        for key in ("_shared", "_corpus", "_tokenizer"):
            state.pop(key, None)
        state["_tokenizer_loaded"] = False
        state["repo"] = self.repo.name if self.repo is not None else None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        repo = state.pop("repo")
        state.setdefault("corpus_name", "default")  # pickled before the corpus option existed
        self.__dict__.update(state)
        self._shared = _Shared()
        self._corpus = None
        self._tokenizer = None
        self.repo = self.corpus.repo(repo) if repo is not None else None

    def card(self) -> dict[str, Any]:
        """A data-set card: the settings, the corpus (packages, versions, file counts) and task counts."""
        pools = self.task_pools()
        return {
            "env": self.name,
            "settings": {
                "horizon": self.horizon,
                "corpus": self.corpus_name,
                "roots": self.roots,
                "tasks_file": self.tasks_file,
                "holdout_repos": list(self.holdout_repos),
                "split_unit": self.split_unit,
                "max_tasks_per_file": self.max_tasks_per_file,
                "max_options": self.max_options,
                "max_content_tokens": self.max_content_tokens,
                "max_content_lines": self.max_content_lines,
                "tokenizer_name_or_path": self.tokenizer_name_or_path,
            },
            "corpus": corpus_card(self.corpus),
            "tasks": task_card(t for split in SPLITS for stage in STAGES for t in pools[split][stage]),
            "tasks_per_split_and_stage": {
                split: {stage: len(pools[split][stage]) for stage in STAGES} for split in SPLITS
            },
        }


def _shuffled_stream(pool: list[Task], salt: str):
    """Yield ``(task, pass_index)`` forever: pass k is a fresh seeded shuffle of ``pool``."""
    rep = 0
    while True:
        order = list(pool)
        random.Random(f"auto_explore-draw|{salt}|{rep}").shuffle(order)
        for task in order:
            yield task, rep
        rep += 1
