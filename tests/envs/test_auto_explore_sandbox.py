"""The AutoExplore sandbox: read-only, inside the repository, never through links, no shell."""

from __future__ import annotations

import os
import threading

import pytest

from reflect_trl.envs.auto_explore.corpus import build_repo_tree
from reflect_trl.envs.auto_explore.example_repo import write_example_repo
from reflect_trl.envs.auto_explore.sandbox import RepoSandbox, SandboxError, parse_command, quote_name

SECRET = "TOP-SECRET-OUTSIDE-CONTENT"


@pytest.fixture()
def sandbox(tmp_path):
    root = write_example_repo(tmp_path / "repos")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(f"{SECRET}\n" * 5)
    (outside / "secret.py").write_text(f"X = '{SECRET}'\n" * 5)
    # Links out of the repository, and one inside it (links are never followed either way).
    os.symlink(outside, root / "link_out")
    os.symlink(outside / "secret.py", root / "coffee" / "leak.py")
    os.symlink(root / "coffee" / "menu.py", root / "coffee" / "menu_alias.py")
    os.symlink(outside, root / "docs" / "more_docs")
    tree = build_repo_tree(root, "coffee_shop")
    return RepoSandbox(tree)


def test_tree_ignores_symlinks(sandbox):
    files = sandbox.tree.walk_files()
    assert "coffee/leak.py" not in files and "coffee/menu_alias.py" not in files
    assert not any(f.startswith(("link_out", "docs/more_docs")) for f in files)
    assert sandbox.tree.stats["symlinks_skipped"] == 4


@pytest.mark.parametrize(
    ("cwd", "command", "reason"),
    [
        ("", "cat ../outside/secret.txt", "outside the repository"),
        ("", "cd ..", "outside the repository"),
        ("coffee/payments", "cat ../../../outside/secret.txt", "outside the repository"),
        ("coffee", "cd ../../../../../../..", "outside the repository"),
        ("coffee", "cat ../coffee/../../outside/secret.py", "outside the repository"),
        ("", "cat /etc/passwd", "absolute path"),
        ("", "cd /", "absolute path"),
        ("", "cat ~/.bashrc", "absolute path"),
        ("", "cat C:/Windows/win.ini", "absolute path"),
        ("", "cd link_out", "symbolic link"),
        ("", "cat link_out/secret.txt", "symbolic link"),
        ("coffee", "cat leak.py", "symbolic link"),
        ("coffee", "cat menu_alias.py", "symbolic link"),
        ("docs", "cat more_docs/secret.txt", "symbolic link"),
        ("", 'cat "menu\x00.py"', "NUL"),
        ("", "cat 'bad\nname.py'", "control characters"),
        ("", "cat 'coffee\\menu.py'", "backslash"),
        ("", "cat coffee\\menu.py", "no such file"),
        ("", "cat .env", "no such file"),
        ("coffee", "cat _private_helpers.py", "no such file"),
        ("", "cat tests/test_menu.py", "no such file"),
        ("", "cat notes.txt", "no such file"),
        ("", "cat does_not_exist.py", "no such file"),
        ("", "cat coffee", "is a directory"),
        ("", "cd README.md", "not a directory"),
        ("", "rm -rf coffee", "unsupported command"),
        ("", "cat README.md; cat /etc/passwd", "exactly one path"),
        ("", "cat $(cat /etc/passwd)", "exactly one path"),
        ("", 'cat "unbalanced', "cannot parse"),
        ("", "", "empty command"),
    ],
)
def test_escape_attempts_are_refused(sandbox, cwd, command, reason, monkeypatch):
    opened: list[str] = []
    real_open = os.open

    def recording_open(path, flags, *args, **kwargs):
        opened.append(os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    result = sandbox.execute(cwd, command)
    assert not result.ok
    assert result.cwd == cwd  # nothing moved
    assert "Error:" in result.message and reason in result.message, result.message
    assert SECRET not in result.message
    assert opened == []  # nothing was read at all


def test_resolve_raises_clear_errors(sandbox):
    with pytest.raises(SandboxError, match="outside the repository"):
        sandbox.resolve("", "../x")
    with pytest.raises(SandboxError, match="NUL"):
        sandbox.resolve("", "a\x00b")
    with pytest.raises(SandboxError, match="empty"):
        sandbox.resolve("", "")
    with pytest.raises(SandboxError, match="working directory"):
        sandbox.resolve("../elsewhere", "README.md")
    with pytest.raises(SandboxError, match="no such file"):
        sandbox.read("../outside/secret.txt")


def test_allowed_commands_work_and_stay_inside(sandbox):
    root = os.path.realpath(sandbox.tree.root)
    result = sandbox.execute("", "cd coffee")
    assert result.ok and result.cwd == "coffee" and "Success: Now at coffee/" in result.message
    result = sandbox.execute("coffee/payments", "cd ../storage/db")
    assert result.ok and result.cwd == "coffee/storage/db"
    result = sandbox.execute("coffee", "cd ..")
    assert result.ok and result.cwd == ""
    result = sandbox.execute("coffee", "cat menu.py")
    assert result.ok and result.path == "coffee/menu.py" and "class Menu" in result.message
    assert result.cwd == "coffee"
    result = sandbox.execute("", "id coffee/orders.py")
    assert result.ok and result.path == "coffee/orders.py" and "Identified file" in result.message
    for path in sandbox.tree.walk_files():
        real = os.path.realpath(sandbox.tree.real_path(path))
        assert os.path.commonpath([real, root]) == root


def test_names_with_spaces_are_quoted_and_parsed(tmp_path):
    root = tmp_path / "repo"
    (root / "my docs").mkdir(parents=True)
    (root / "my docs" / "read me.md").write_text("# Read me first\n\nSome words about the project.\n")
    sandbox = RepoSandbox(build_repo_tree(root))
    assert quote_name("read me.md") == '"read me.md"'
    assert quote_name("plain_name.py") == "plain_name.py"
    assert parse_command(f"cat {quote_name('read me.md')}") == ("cat", "read me.md")
    result = sandbox.execute("", f"cd {quote_name('my docs')}")
    assert result.ok and result.cwd == "my docs"
    result = sandbox.execute("my docs", f"cat {quote_name('read me.md')}")
    assert result.ok and "Read me first" in result.message


def test_package_mount_refuses_siblings(tmp_path):
    """An installed package is mounted under its name; its site-packages siblings are outside."""
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "core.py").write_text("def public_function():\n    return 'inside the package'\n")
    (site / "other").mkdir()
    (site / "other" / "secret.py").write_text(f"X = '{SECRET}'\n")
    tree = build_repo_tree(site / "pkg", "pkg", mount="pkg", source="package")
    sandbox = RepoSandbox(tree)
    assert tree.walk_files() == ["pkg/core.py"]
    assert sandbox.execute("", "cd pkg").ok
    for cwd, command in [("pkg", "cat ../other/secret.py"), ("", "cd other"), ("pkg", "cd ../..")]:
        result = sandbox.execute(cwd, command)
        assert not result.ok and "outside the repository" in result.message and SECRET not in result.message


def test_sandbox_is_usable_from_threads(sandbox):
    errors: list[BaseException] = []
    results: list[str] = []

    def worker(i: int) -> None:
        try:
            for _ in range(50):
                ok = sandbox.execute("coffee", "cat menu.py")
                bad = sandbox.execute("coffee", "cat ../../outside/secret.txt")
                assert ok.ok and not bad.ok
                results.append(ok.message)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(set(results)) == 1 and len(results) == 200
