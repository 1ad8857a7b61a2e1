"""Notices of dependencies that a user cannot act on are silenced by the library itself, not only by the CLI."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_library_and_its_dependencies_prints_nothing():
    code = "import reflect_trl\nfrom reflect_trl import ReflectSFTConfig\nimport peft\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "kernels" not in done.stderr and done.stderr.strip() == "", done.stderr
