"""Keep multiprocessing from re-running a ``__main__`` that would launch again.

Why: once workers were launched at module level, outside a main guard, any later spawn or
forkserver child of this process (a ``multiprocessing.Pool``, a DataLoader, a compile pool, in
the program or inside a forked worker) re-runs ``__main__`` and reaches that launch again. The
child then dies during start-up, and a Pool replaces it for ever: a hang with a screen of
tracebacks. Refusing at the moment CPython's ``spawn.get_preparation_data`` reads
``__main__.__spec__`` turns that into one clear error in the process that starts the child.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from hwlaunch.errors import MissingMainGuardError

_REASON = "__hwlaunch_reimport_refused__"


class _RefusingMain(types.ModuleType):
    """A ``__main__`` whose ``__spec__`` multiprocessing may not read; everyone else may."""

    @property
    def __spec__(self) -> Any:
        if sys._getframe(1).f_globals.get("__name__") == "multiprocessing.spawn":
            raise MissingMainGuardError(self.__dict__[_REASON])
        return self.__dict__.get("__spec__")

    @__spec__.setter
    def __spec__(self, value: Any) -> None:
        self.__dict__["__spec__"] = value


def refuse_reimport(where: str) -> None:
    """From now on, starting a spawn/forkserver child in this process raises, naming ``where``."""
    main = sys.modules.get("__main__")
    if main is None or type(main) not in (types.ModuleType, _RefusingMain):
        return  # a custom module class (IPython's): leave it alone
    main.__dict__[_REASON] = (
        f"a spawn or forkserver child started here would re-run __main__, which reaches "
        f'{where} outside `if __name__ == "__main__":` and would launch the workers again (the '
        "child would die while starting, and a Pool would wait for ever). Fix: put the launch "
        'under `if __name__ == "__main__":`, or start this child with '
        "multiprocessing.get_context('fork')"
    )
    main.__class__ = _RefusingMain
