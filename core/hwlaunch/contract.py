"""The plugin contract's version, and how a plugin's demand for a version is checked.

Plugins are written against a contract (hooks, BackendSpec fields, Worker methods), not against
a hwlaunch release. The contract is versioned ``MAJOR.MINOR``: a minor release only adds (a new
optional hook or field), a major one may remove what was deprecated. A plugin declares the
contract it needs (``BackendSpec(contract="1.1")``, or ``HWLAUNCH_CONTRACT = "1.1"`` in a plugin
module that registers no backend); an older hwlaunch refuses it with a message naming both
versions, instead of failing later on a field or hook it does not know.

Deprecation: a field or hook is deprecated for at least one minor release before a major release
removes it; using it warns with :class:`HwlaunchDeprecationWarning` (hooks through pluggy's
``warn_on_impl``, fields through :data:`DEPRECATED_FIELDS`).
"""

from __future__ import annotations

import re
import sys

from hwlaunch.errors import PluginError

CONTRACT_VERSION = "1.1"  # 1.1 added BackendSpec.shutdown_timeout
_VERSION = re.compile(r"^(\d+)\.(\d+)$")

# BackendSpec field -> what to use instead (and when it goes). A spec that sets such a field to
# anything but its default warns once, at registration. Empty: nothing in contract 1.0 is
# deprecated yet.
DEPRECATED_FIELDS: dict[str, str] = {}


class HwlaunchDeprecationWarning(DeprecationWarning):
    """A plugin uses a hook or BackendSpec field that a later major contract removes."""


def parse_version(value: object, what: str) -> tuple[int, int]:
    """``"1.2"`` -> ``(1, 2)``; anything else is a PluginError naming ``what``."""
    found = _VERSION.match(value) if isinstance(value, str) else None
    if found is None:
        raise PluginError(
            f"{what} declares contract {value!r}, which is not a version like "
            f"{CONTRACT_VERSION!r} (MAJOR.MINOR)"
        )
    return int(found.group(1)), int(found.group(2))


def require(value: object, what: str) -> str:
    """Check that the installed contract satisfies what ``what`` declares; return the version.

    Same major and a minor no higher than ours: the plugin uses nothing we lack. A higher
    version needs a newer hwlaunch; a lower major was written for an interface we removed.
    """
    major, minor = parse_version(value, what)
    own_major, own_minor = parse_version(CONTRACT_VERSION, "hwlaunch")
    version = f"{major}.{minor}"
    if (major, minor) > (own_major, own_minor):
        # The package, loaded before any of its modules; not imported by name, which would make
        # the contract depend on the facade that names every layer.
        installed = sys.modules["hwlaunch"].__version__
        raise PluginError(
            f"{what} needs plugin contract {version}, but the installed hwlaunch {installed} "
            f"provides contract {CONTRACT_VERSION}. Fix: upgrade hwlaunch "
            f"(pip install --upgrade hwlaunch) to a release with contract {version} or later"
        )
    if major < own_major:
        raise PluginError(
            f"{what} was written for plugin contract {version}, and the installed hwlaunch "
            f"provides contract {CONTRACT_VERSION} (major {own_major}). Fix: upgrade the plugin "
            f"to one written for contract {own_major}.x"
        )
    return version
