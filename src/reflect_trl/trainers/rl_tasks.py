"""The tasks of an RL run: the training pool of each curriculum stage and the evaluation episodes, as datasets."""

from __future__ import annotations

import json
from pathlib import Path

from datasets import Dataset

from reflect_trl.envs import Task, make_env
from reflect_trl.trainers.rl_config import ReflectPPOConfig


def tasks_to_dataset(tasks: list[Task]) -> Dataset:
    """The RL train dataset: one row per task (``prompt`` = task id, ``task`` = the task as JSON)."""
    return Dataset.from_list(
        [{"prompt": t.task_id, "task": json.dumps(t.to_dict(), sort_keys=True)} for t in tasks]
    )


def eval_tasks_dataset(args: ReflectPPOConfig) -> Dataset:
    """The evaluation episodes of :meth:`ReflectPPOTrainer.evaluate`: ``eval_episodes_per_stage`` tasks of
    ``eval_split`` per stage the run trains on, with the episode seeds `reflect-trl eval --seed eval_seed` uses."""
    from reflect_trl.evaluation import stage_eval_tasks

    env = make_env(args.env_name, **args.evaluation_env_kwargs)
    rows: dict[str, list] = {"task": [], "episode_seed": []}
    for stage in args.curriculum_stages or list(env.stages):
        tasks, seeds = stage_eval_tasks(
            args.env_name,
            args.evaluation_env_kwargs,
            args.eval_split,
            args.eval_episodes_per_stage,
            args.eval_seed,
            stage,
        )
        rows["task"] += [json.dumps(t.to_dict()) for t in tasks]
        rows["episode_seed"] += seeds
    return Dataset.from_dict(rows)


def build_train_tasks(args: ReflectPPOConfig) -> list[Task]:
    """``num_train_tasks`` training tasks for each stage the run trains on, or the tasks of ``train_tasks_file``
    (those of those stages)."""
    env = make_env(args.env_name, **(args.env_kwargs or {}))
    stages = args.curriculum_stages or list(env.stages)
    if args.train_tasks_file:
        return [t for t in read_tasks(args.train_tasks_file, args.env_name) if t.difficulty in stages]
    return [t for s in stages for t in env.make_tasks("train", args.num_train_tasks, args.task_seed, s)]


def read_tasks(path: str | Path, env_name: str) -> list[Task]:
    """Tasks from a JSONL file of ``Task.to_dict()`` rows; an error names the file, the line and the field."""
    tasks = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                task = Task.from_dict(json.loads(line))
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(f"{path}:{lineno}: not a task ({err})") from None
            if task.env != env_name:
                raise ValueError(
                    f"{path}:{lineno}: field 'env' is {task.env!r}, the run's environment is {env_name!r}"
                )
            tasks.append(task)
    if not tasks:
        raise ValueError(f"{path}: no tasks")
    return tasks


__all__ = ["build_train_tasks", "eval_tasks_dataset", "tasks_to_dataset"]
