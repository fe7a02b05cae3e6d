"""What launch() checks in the driver before any process starts.

Why here: a plan made for an imagined machine, or a worker extension that cannot be imported,
would otherwise fail in every worker, deep in torch or in the worker's import, one traceback
per rank. The driver can say it once, naming the cause.
"""

from __future__ import annotations

import multiprocessing
import re

from hwlaunch.errors import ConfigError
from hwlaunch.plan import Plan

__all__ = ["check_extension_path", "refuse_imagined_machine"]

_EXTENSION_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _device_claims(plan: Plan) -> list[str]:
    """The assumed facts of the plan's backend that its probes here contradict, where the
    workers would rely on them: a device that is absent, more devices than there are, or a
    runtime assumed uninitialized that is (fork would break it)."""
    from hwlaunch.planning.facts import probe_device
    from hwlaunch.planning.registry import default_registry

    assert plan.facts is not None
    entry = default_registry().backends.get(plan.backend)
    if entry is None:
        return []
    spec, assumed = entry.spec, plan.facts.devices[plan.backend]
    probed = probe_device(spec)
    keys = {key.partition(".")[2] for key in plan.facts.assumed if key.startswith(f"{spec.name}.")}
    claims = []
    if "available" in keys and assumed.available and not probed.available:
        claims.append(f"{spec.name}.available (assumed true, probed false)")
    if (
        "device_count" in keys
        and spec.is_accelerator
        and assumed.device_count > probed.device_count
    ):
        claims.append(
            f"{spec.name}.device_count (assumed {assumed.device_count}, probed "
            f"{probed.device_count})"
        )
    if "initialized" in keys and probed.initialized and not assumed.initialized:
        claims.append(f"{spec.name}.initialized (assumed false, probed true)")
    return claims


def _process_claims(plan: Plan) -> list[str]:
    """The assumed start methods and launcher, where this process differs."""
    from hwlaunch.planning.launchers import detect_launcher

    assert plan.facts is not None
    claims = []
    offered = multiprocessing.get_all_start_methods()
    if "start_methods" in plan.facts.assumed and plan.start_method not in (None, *offered):
        claims.append(
            f"start_methods (assumed {','.join(plan.facts.os_start_methods)}; this OS offers "
            f"{','.join(offered)}, not {plan.start_method})"
        )
    if "launcher" in plan.facts.assumed and plan.facts.launcher.detected:
        here = detect_launcher().launcher
        if here != plan.facts.launcher.launcher:
            claims.append(f"launcher (assumed {plan.facts.launcher.launcher}, detected {here})")
    return claims


def refuse_imagined_machine(plan: Plan) -> None:
    """Refuse a what-if plan whose assumed facts this machine lacks."""
    if plan.facts is None or not plan.facts.assumed:
        return
    claims = _device_claims(plan) + _process_claims(plan)
    if claims:
        raise ConfigError(
            f"launch() refuses this plan: it was made with assumed facts that this machine "
            f"lacks: {'; '.join(claims)}. A plan from assumed facts shows what would happen "
            "elsewhere; its workers cannot start here. Fix: launch a plan resolved without "
            "assume= (or --assume), from the facts probed on this machine"
        )


def check_extension_path(extension: type | str | None) -> None:
    """Import a ``"package.module:ClassName"`` worker extension here, so that a typo or a
    missing package is one ConfigError naming it rather than a failure in every worker."""
    if not isinstance(extension, str):
        return
    from hwlaunch.executor._runtime import import_object

    where = f"worker_extension {extension!r}"
    if not _EXTENSION_PATH.match(extension):
        raise ConfigError(f"{where} is not an import path; write 'package.module:ClassName'")
    try:
        found = import_object(extension)
    except Exception as exc:  # any import failure: name it, with the cause
        raise ConfigError(
            f"{where} cannot be imported in the driver: {type(exc).__name__}: {exc}. Fix: the "
            "module must be importable where hwlaunch runs (installed, or on sys.path), and "
            "define the class"
        ) from exc
    if not isinstance(found, type):
        raise ConfigError(f"{where} is {type(found).__name__} {found!r}, not a class")
