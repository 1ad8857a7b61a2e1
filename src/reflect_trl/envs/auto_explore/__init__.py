"""AutoExplore: repository navigation over real code (corpus, tasks, sandbox, environment)."""

from reflect_trl.envs.auto_explore.corpus import (
    ALLOWED_SUFFIXES,
    DEFAULT_MAX_OPTIONS,
    DEFAULT_PACKAGES,
    Corpus,
    CorpusFilter,
    RepoTree,
    build_corpus,
    build_repo_tree,
    corpus_card,
    default_roots,
    load_corpus,
)
from reflect_trl.envs.auto_explore.env import AutoExploreEnv, StepRecord
from reflect_trl.envs.auto_explore.sandbox import RepoSandbox, SandboxError
from reflect_trl.envs.auto_explore.tasks import (
    STAGES,
    Candidate,
    CodeQuestionSource,
    QuestionSource,
    generate_tasks,
    holdout_split,
    load_tasks,
    save_tasks,
    stage_of_depth,
    task_card,
)

__all__ = [
    "ALLOWED_SUFFIXES",
    "DEFAULT_MAX_OPTIONS",
    "DEFAULT_PACKAGES",
    "STAGES",
    "AutoExploreEnv",
    "Candidate",
    "CodeQuestionSource",
    "Corpus",
    "CorpusFilter",
    "QuestionSource",
    "RepoSandbox",
    "RepoTree",
    "SandboxError",
    "StepRecord",
    "build_corpus",
    "build_repo_tree",
    "corpus_card",
    "default_roots",
    "generate_tasks",
    "holdout_split",
    "load_corpus",
    "load_tasks",
    "save_tasks",
    "stage_of_depth",
    "task_card",
]
