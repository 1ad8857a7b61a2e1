"""The README's instructions run as written: the Python snippet of "Use", the make targets it names, and the
CPU-only torch install."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_python_snippet_runs_as_written(tmp_path, monkeypatch):
    [code] = [
        b for b in re.findall(r"```python\n(.*?)```", section("Use"), re.S) if "ReflectPPOTrainer(" in b
    ]
    monkeypatch.chdir(tmp_path)  # models/ and outputs/ land here
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == trainer.args.max_steps
    out = tmp_path / trainer.args.output_dir
    assert (out / "model.safetensors").is_file() and (out / "reflect_trl_labels.json").is_file()
    card = (out / "README.md").read_text()
    assert "**Environment:** `taxi`" in card and "**Reflection model (frozen):**" in card


def make_dry_run(*args: str) -> str:
    proc = subprocess.run(["make", "-n", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_every_make_target_of_the_use_section_exists():
    block = re.findall(r"```bash\n(.*?)```", section("Use"), re.S)[0]
    targets = re.findall(r"^make ([a-z-]+)", block, re.M)
    assert {"sft", "rl", "rl-plain", "eval", "plot"} <= set(targets)
    for target in targets:
        make_dry_run(target)
    # the eval recipe's rows are produced by the block: the plain SFT policy and the no-reflection RL run
    assert "make sft ROLE=plain" in block
    assert "--output_dir outputs/taxi/cpu/rl_plain" in make_dry_run("rl-plain")
    assert "outputs/taxi/cpu/rl_plain" in (REPO / "recipes/taxi/cpu/eval.yaml").read_text()
    assert "plain=outputs/taxi/cpu/rl_plain" in block  # the plot shows the baseline too


def test_cpu_torch_index_is_passed_to_pip(tmp_path):
    venv = str(tmp_path / "venv")  # not created: -n only prints the commands
    index = "https://download.pytorch.org/whl/cpu"
    with_index = make_dry_run("install", f"TORCH_INDEX={index}", f"VENV={venv}")
    assert f"pip install torch==2.13.0 --index-url {index}" in with_index
    plain = make_dry_run("install", f"VENV={venv}")
    assert "pip install torch==2.13.0" in plain and "--index-url" not in plain
    assert f"make install TORCH_INDEX={index}" in section("Install")


def test_launch_passes_cpu_threads_to_accelerate():
    """accelerate prints a notice when it picks the CPU threads itself."""
    assert "--num_cpu_threads_per_process 3" in make_dry_run("rl", "CPU_THREADS=3")
    assert re.search(r"--num_cpu_threads_per_process \d+ ", make_dry_run("rl"))


def test_bring_your_own_model_section_runs_the_shipped_pieces():
    """The oracle requirement comes first; the commands name the real-model target, recipes and entry points that
    exist; the activation line and the measured summary are there."""
    text = section("Bring your own model and environment")
    assert text.index("oracle") < text.index("```bash")
    block = re.findall(r"```bash\n(.*?)```", text, re.S)[0]
    for recipe in re.findall(r"--config (\S+\.yaml)", block):
        assert (REPO / recipe).is_file(), recipe
    assert {"data", "sft", "rl"} <= set(re.findall(r"reflect-trl (\w+) --config", block))
    for target in re.findall(r"\bmake ([a-z-]+)", block):
        make_dry_run(target, "RECIPES=recipes/taxi")
    assert "benchmarks/real_model_steps.py" in text and "not yet run on a GPU" in text
    assert "source .venv/bin/activate" in README
