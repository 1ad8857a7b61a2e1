"""``python -m reflect_trl.cli`` (and ``accelerate launch -m reflect_trl.cli``)."""

import sys

from reflect_trl.cli import main

sys.exit(main())
