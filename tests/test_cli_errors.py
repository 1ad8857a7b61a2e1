"""Bad input through the real command line.

For every case of the corpus: the exit status (2 for bad input, 1 for a failure during the run), the culprit (file,
field or value) named in ONE ``reflect-trl <command>: error: ...`` line, no traceback, no import-time noise, and no
output directory left behind.

Importing TRL's config classes takes seconds, so the corpus runs through ``tests/_cli_fork_driver.py``: one process
imports the CLI once and forks a child per command line, which runs it as ``python -m reflect_trl.cli`` does (own
working directory, environment, stdout/stderr and exit status). A few command lines also run as fresh
``python -m reflect_trl.cli`` processes, which is where import-time noise would show.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

#: Lines that must never reach a user's terminal (import-time notices, dependency deprecations).
NOISE = ("Traceback", "Failed to load CPU gemm_4bit_forward", "FutureWarning")


@dataclass
class Case:
    name: str
    argv: list[str]
    status: int
    culprits: tuple[str, ...]
    absent: tuple[str, ...] = ()  # names under the work directory that must not exist afterwards
    not_in_message: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


def _cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REFLECT_TRL_DEBUG", "PYTHONWARNINGS")}
    env.update({"HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"})
    env.update(extra or {})
    return env


DRIVER = Path(__file__).with_name("_cli_fork_driver.py")


def run_forked(cases: list[Case], cwd: Path) -> list[tuple[int, str]]:
    """(exit status, stderr) of each case, run by the fork driver."""
    spec = cwd / "cases.json"
    spec.write_text(json.dumps([{"argv": c.argv, "cwd": str(cwd), "env": c.env} for c in cases]))
    proc = subprocess.run(
        [sys.executable, str(DRIVER), str(spec)], capture_output=True, text=True, env=_cli_env(), timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [(r["status"], r["stderr"]) for r in json.loads(proc.stdout)]


def run_cli(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reflect_trl.cli", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=_cli_env(env),
        timeout=300,
    )


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A tiny model, recipes and data files with one defect each."""
    from reflect_trl.tiny_models import build_tiny_model

    root = tmp_path_factory.mktemp("cli_errors")
    build_tiny_model(root / "tiny", arch="llama", preset="nano", seed=0)
    broken = root / "broken_model"  # a model directory whose weights cannot be loaded
    shutil.copytree(root / "tiny", broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    (root / "typo.yaml").write_text("model_name_or_path: tiny\nlearning_rat: 0.001\n")
    (root / "broken.yaml").write_text("model_name_or_path: tiny\nenv_kwargs: {step_reward: 0\n")
    (root / "eval_typo.yaml").write_text("env_name: taxi\nepisodes: 3\nconfigurations: [{policy: oracle}]\n")
    policy_row = {"prompt": "state\n# Options:\nA. north\nB. south\n# Action:\n", "completion": "A"}
    good = json.dumps(policy_row)
    (root / "truncated.jsonl").write_text(good + "\n" + good[:25] + "\n")
    (root / "no_completion.jsonl").write_text(json.dumps({"prompt": policy_row["prompt"]}) + "\n")
    (root / "empty_completion.jsonl").write_text(json.dumps({**policy_row, "completion": ""}) + "\n")
    reflection_row = {"prompt": "state\n# Reflection:\n", "completion": "go north<end>"}
    (root / "reflection.jsonl").write_text(json.dumps(reflection_row) + "\n")
    return root


RL = ["rl", "--model_name_or_path", "tiny", "--use_cpu", "--bf16", "false", "--max_steps", "3"]
RL_OUT = [*RL, "--output_dir", "out/rl", "--report_to", "wandb"]
SFT = ["sft", "--model_name_or_path", "tiny", "--use_cpu", "--output_dir", "out/sft", "--report_to", "wandb"]

CASES = [
    Case("unknown command", ["evl"], 2, ("unknown command 'evl'", "did you mean 'eval'")),
    Case("rl: unknown env", [*RL_OUT, "--env_name", "nope"], 2, ("'nope'", "taxi"), ("out",)),
    Case(
        "rl: unknown recipe key",
        ["rl", "--config", "typo.yaml"],
        2,
        ("typo.yaml", "learning_rat", "learning_rate"),
    ),
    Case("rl: missing recipe file", ["rl", "--config", "recipes/none.yaml"], 2, ("recipes/none.yaml",)),
    Case("rl: YAML syntax error", ["rl", "--config", "broken.yaml"], 2, ("broken.yaml", "line", "YAML")),
    Case("rl: out-of-range value", [*RL_OUT, "--gamma", "1.5"], 2, ("gamma", "1.5"), ("out",)),
    Case("rl: unknown advantage_estimator", [*RL_OUT, "--advantage_estimator", "ppo2"], 2, ("ppo2", "rloo")),
    Case(
        "rl: env_kwargs not JSON", [*RL_OUT, "--env_kwargs", "{horizon: 3"], 2, ("env_kwargs", "{horizon: 3")
    ),
    Case(
        "rl: env_kwargs unknown",
        [*RL_OUT, "--env_kwargs", '{"horizn": 3}'],
        2,
        ("env_kwargs", "horizn"),
        ("out",),
    ),
    Case(
        "rl: multi-token option labels",
        [*RL_OUT, "--option_labels", '["AAA","BBB"]'],
        2,
        ("option_labels", "['AAA', 'BBB']"),
        ("out",),
        not_in_message=("same token as",),
    ),
    Case(
        "rl: missing model directory",
        [*RL_OUT[:1], "--model_name_or_path", "./models/nope", *RL_OUT[3:]],
        2,
        ("model_name_or_path", "./models/nope", "does not exist"),
        ("out",),
        not_in_message=("Repo id",),
    ),
    Case(
        "rl: missing reflection model",
        [*RL_OUT, "--reflection_model_name_or_path", "outputs/x/sft_reflection"],
        2,
        ("reflection_model_name_or_path", "outputs/x/sft_reflection"),
        ("out",),
    ),
    Case(
        "rl: bad reflection_backend",
        [*RL_OUT, "--reflection_backend", "vllm"],
        2,
        ("reflection_backend", "vllm"),
    ),
    Case(
        "rl: openai backend without URL",
        [*RL_OUT, "--reflection_backend", "openai", "--reflection_server_model", "r"],
        2,
        ("reflection_base_url",),
    ),
    Case(
        "rl: bad server URL",
        [
            *RL_OUT,
            "--reflection_backend",
            "openai",
            "--reflection_base_url",
            "localhost:8000",
            "--reflection_server_model",
            "r",
        ],  # fmt: skip
        2,
        ("localhost:8000", "http"),
        ("out",),
    ),
    Case("rl: unknown flag", [*RL_OUT, "--learning_rat", "0.1"], 2, ("--learning_rat", "--learning_rate")),
    Case("rl: value of the wrong type", [*RL_OUT, "--max_steps", "many"], 2, ("--max_steps", "many")),
    Case(
        "rl: unknown curriculum stage",
        [*RL_OUT, "--curriculum_stages", "pickup,nope"],
        2,
        ("'nope'",),
        ("out",),
    ),
    Case(
        "rl: setup fails after validation",
        [*RL[:2], "broken_model", *RL[3:], "--output_dir", "out/rl_broken", "--report_to", "wandb"],
        1,
        ("cannot load the model 'broken_model'",),
        ("out",),
    ),
    Case(
        "sft: truncated JSONL",
        [*SFT, "--dataset_path", "truncated.jsonl"],
        2,
        ("truncated.jsonl", "line 2"),
        ("out",),
    ),
    Case(
        "sft: missing completion",
        [*SFT, "--dataset_path", "no_completion.jsonl"],
        2,
        ("no_completion.jsonl", "'completion'"),
        ("out",),
    ),
    Case(
        "sft: empty completion",
        [*SFT, "--dataset_path", "empty_completion.jsonl"],
        2,
        ("empty_completion.jsonl", "'completion' is empty"),
        ("out",),
    ),
    Case(
        "sft: data of the other role",
        [*SFT, "--dataset_path", "reflection.jsonl"],
        2,
        ("reflection.jsonl", "role='reflection'"),
        ("out",),
    ),
    Case(
        "sft: missing model directory",
        [
            "sft",
            "--model_name_or_path",
            "/nonexistent/model",
            "--dataset_path",
            "reflection.jsonl",
            "--use_cpu",
        ],
        2,
        ("/nonexistent/model", "does not exist"),
    ),
    Case(
        "sft: bad role",
        [*SFT, "--dataset_path", "reflection.jsonl", "--role", "critic"],
        2,
        ("critic",),
        ("out",),
    ),
    Case(
        "data: unknown stage",
        ["data", "--stages", "pickup,nope", "--output_dir", "out/data"],
        2,
        ("'nope'",),
        ("out",),
    ),
    Case(
        "data: out-of-range value",
        ["data", "--negative_prob", "1.5", "--output_dir", "out/data"],
        2,
        ("negative_prob", "1.5"),
        ("out",),
    ),
    Case(
        "eval: no configurations", ["eval", "--output_dir", "out/eval"], 2, ("nothing to evaluate",), ("out",)
    ),
    Case(
        "eval: unknown env",
        ["eval", "--policy", "oracle", "--env_name", "nope", "--output_dir", "out/eval"],
        2,
        ("'nope'",),
        ("out",),
    ),
    Case(
        "eval: missing policy directory",
        ["eval", "--policy", "outputs/taxi/rl", "--name", "RL", "--output_dir", "out/eval"],
        2,
        ("'RL'", "outputs/taxi/rl", "does not exist"),
        ("out",),
    ),
    Case("eval: unknown setting", ["eval", "--config", "eval_typo.yaml"], 2, ("eval_typo.yaml", "episodes")),
    Case(
        "eval: unknown decoding", ["eval", "--policy", "oracle", "--decodings", "greedy,beam"], 2, ("beam",)
    ),
    Case(
        "eval: runtime failure",
        ["eval", "--policy", "broken_model", "--episodes_per_stage", "1", "--output_dir", "out/eval"],
        1,
        ("cannot load the model 'broken_model'",),
        ("out",),
    ),
    Case(
        "demo: unknown field",
        ["demo", "--rl_stepz", "3", "--output_dir", "out/demo"],
        2,
        ("--rl_stepz",),
        ("out",),
    ),
    Case(
        "demo: bad preset",
        ["demo", "--model_preset", "huge", "--output_dir", "out/demo"],
        2,
        ("model_preset", "huge"),
        ("out",),
    ),
    Case(
        "plot: missing run", ["plot", "--runs", "rl=outputs/none/rl"], 2, ("outputs/none/rl",), ("outputs",)
    ),
    Case(
        "build-tiny: unknown env",
        ["build-tiny", "--envs", "taxi,nope", "--output_dir", "out/tiny"],
        2,
        ("'nope'",),
        ("out",),
    ),
    Case(
        "relabel: missing data set",
        ["relabel", "--dataset", "data/none.jsonl", "--reflection_model", "tiny", "--output", "out/relabel"],
        2,
        ("data/none.jsonl",),
        ("out",),
    ),
    Case(
        "lookup-data: missing data set",
        ["lookup-data", "--dataset", "data/none.jsonl", "--output", "out/lookup"],
        2,
        ("data/none.jsonl",),
        ("out",),
    ),
    Case(
        "lookup-data: no copies",
        ["lookup-data", "--dataset", "data/none.jsonl", "--output", "out/lookup", "--copies", "0"],
        2,
        ("--copies", "0"),
        ("out",),
    ),
]


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 20 and len({c.name for c in CASES}) == len(CASES)


def problems_of(case: Case, status: int, stderr: str, work: Path) -> list[str]:
    """What is wrong with how a bad input was answered (empty: nothing)."""
    command = case.argv[0] if case.argv[0] in _COMMANDS else None
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if ": error:" in line]
    prefix = f"reflect-trl {command}: error:" if command else "reflect-trl: error:"
    problems = []
    if status != case.status:
        problems.append(f"exit status {status}, expected {case.status}")
    if len(errors) != 1 or not lines or not lines[-1].startswith(prefix):
        problems.append(f"expected one final line starting with {prefix!r}")
    message = errors[-1] if errors else ""
    problems += [f"culprit {c!r} not named" for c in case.culprits if c not in message]
    problems += [f"{c!r} in the message" for c in case.not_in_message if c in message]
    problems += [f"{n!r} on stderr" for n in NOISE if n in stderr]
    problems += [f"{a} was left behind" for a in case.absent if (work / a).exists()]
    return problems


#: Command lines of the other tests, run by the same driver as the corpus.
EXTRA = {
    "--debug": Case("--debug", ["--debug", "eval", "--policy", "oracle", "--env_name", "nope"], 2, ()),
    "REFLECT_TRL_DEBUG": Case(
        "REFLECT_TRL_DEBUG",
        ["eval", "--policy", "oracle", "--env_name", "nope"],
        2,
        (),
        env={"REFLECT_TRL_DEBUG": "1"},
    ),
    "broken": Case("broken", ["eval", "--policy", "broken_model", "--episodes_per_stage", "1"], 1, ()),
    "kept": Case(
        "kept", [*RL[:2], "broken_model", *RL[3:], "--output_dir", "kept", "--report_to", "wandb"], 1, ()
    ),
}


@pytest.fixture(scope="module")
def forked(work) -> dict[str, tuple[int, str]]:
    """(exit status, stderr) of every case of CASES and EXTRA, by name (one driver run)."""
    (work / "kept" / "earlier").mkdir(parents=True)
    cases = [*CASES, *EXTRA.values()]
    return {c.name: result for c, result in zip(cases, run_forked(cases, work), strict=True)}


def test_bad_inputs_end_with_one_clear_line(work, forked):
    failures = []
    for case in CASES:
        status, stderr = forked[case.name]
        problems = problems_of(case, status, stderr, work)
        if problems:
            failures.append(f"{case.name}: {'; '.join(problems)}\n    stderr: {stderr[-1500:]}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("names", [("rl: unknown env", "sft: missing completion")])
def test_fresh_processes_are_quiet_too(work, names):
    """In a fresh ``python -m reflect_trl.cli``: no import-time notice (bitsandbytes' optional kernels), no
    FutureWarning, the same one-line answer."""
    cases = [c for c in CASES if c.name in names]
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:
        procs = list(pool.map(lambda c: run_cli(c.argv, work, c.env), cases))
    for case, proc in zip(cases, procs, strict=True):
        assert not problems_of(case, proc.returncode, proc.stderr, work), proc.stderr


_COMMANDS = {
    "envs",
    "build-tiny",
    "data",
    "relabel",
    "lookup-data",
    "sft",
    "rl",
    "eval",
    "plot",
    "demo",
    "reproduce",
}


def test_debug_shows_the_traceback(forked):
    for name in ("--debug", "REFLECT_TRL_DEBUG"):
        status, stderr = forked[name]
        assert status == 2
        assert "Traceback" in stderr and stderr.strip().splitlines()[-1].startswith(
            "reflect-trl eval: error:"
        )


def test_runtime_failure_names_the_model_and_hints_at_debug(forked):
    status, stderr = forked["broken"]
    assert status == 1
    assert "cannot load the model 'broken_model'" in stderr
    assert "reflect-trl --debug eval" in stderr and "Traceback" not in stderr


def test_an_existing_output_directory_is_kept(work, forked):
    status, stderr = forked["kept"]
    assert status == 1, stderr
    assert (work / "kept" / "earlier").is_dir()


def test_a_reader_that_closes_the_pipe_is_not_an_error():
    """`reflect-trl envs | grep -q x` closes stdout early: the command stops quietly (status 141, as SIGPIPE would)."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; from reflect_trl.cli import main; sys.exit(main(['envs']))"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "REFLECT_TRL_PROGRESS": "0"},
    )
    child.stdout.close()  # the reader is gone before the first line is written
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == 141, stderr.decode()
    assert b"error" not in stderr and b"Traceback" not in stderr, stderr.decode()
