"""``python -m hwlaunch.cli``."""

from __future__ import annotations

import sys

from hwlaunch.cli import main

if __name__ == "__main__":
    sys.exit(main())
