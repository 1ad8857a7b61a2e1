"""The example packages are imported from this working tree (``examples/*/src``), installed or not."""

from __future__ import annotations

import sys

from _plugins import EXAMPLE_SRC

if str(EXAMPLE_SRC) not in sys.path:
    sys.path.insert(0, str(EXAMPLE_SRC))
