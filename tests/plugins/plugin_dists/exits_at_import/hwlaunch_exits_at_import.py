"""A plugin that calls sys.exit() at import: it must not end the process that loads it."""

from __future__ import annotations

import sys

sys.exit("hwlaunch-exits-at-import refuses to load")
