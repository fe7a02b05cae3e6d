"""A worker extension module that fails at import, once every worker has left its pid.

The pids let the test check that every worker that was started is gone afterwards; waiting for
all of them makes sure that each one got this far before the launch fails.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


class X:
    """The class the tests name (``hwl_ext_broken:X``): the driver finds it in the source, and
    the workers' import fails before they can use it."""


markers = Path(os.environ["HWL_TEST_MARKERS"])
(markers / f"pid-{os.getpid()}").touch()
deadline = time.monotonic() + 60
while len(list(markers.glob("pid-*"))) < int(os.environ.get("WORLD_SIZE", "1")):
    if time.monotonic() > deadline:
        break
    time.sleep(0.005)
raise RuntimeError("hwl_ext_broken fails at import on purpose")
