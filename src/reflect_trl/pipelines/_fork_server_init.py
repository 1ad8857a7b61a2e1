"""Imported first by the job pool's fork server (:func:`reflect_trl.pipelines.jobs.preload_modules`), before torch and the
libraries: what ``reflect-trl`` sets up before a command runs, so that the server's own imports and every forked job
see it.

* :func:`reflect_trl.quiet.quiet_dependencies` (import-time notices of optional kernels, dependency deprecations);
* a forked worker imports the caller's main module again as ``__mp_main__``; under ``python -m reflect_trl.cli`` the
  fork server has that module imported already and runpy warns about it (harmless: the module only defines
  functions).
"""

from __future__ import annotations

import warnings

from reflect_trl.quiet import quiet_dependencies

quiet_dependencies()
warnings.filterwarnings(
    "ignore", message=r"'reflect_trl\.cli' found in sys\.modules", category=RuntimeWarning
)
