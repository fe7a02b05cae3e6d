"""What launch() checks in the driver before any process starts.

Why here: a plan made for an imagined machine, or a worker extension that cannot be imported,
would otherwise fail in every worker, deep in torch or in the worker's import, one traceback
per rank. The driver can say it once, naming the cause.

Nothing here decides again: the start method and the rest of the plan stay as resolved. What is
checked is what may differ between the facts the plan was made from and this process at launch
(a plan resolved with assumed facts, or elsewhere): a fact the plan relied on that is false here
refuses the launch, with the fact named.
"""

from __future__ import annotations

import ast
import multiprocessing
import os
import re
import sys
from importlib.machinery import ModuleSpec

from hwlaunch._checks import did_you_mean
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
    """The assumed start methods, threads and launcher, where this process differs."""
    from hwlaunch.planning.launchers import detect_launcher

    assert plan.facts is not None
    claims = []
    offered = multiprocessing.get_all_start_methods()
    if "start_methods" in plan.facts.assumed and plan.start_method not in (None, *offered):
        claims.append(
            f"start_methods (assumed {','.join(plan.facts.os_start_methods)}; this OS offers "
            f"{','.join(offered)}, not {plan.start_method})"
        )
    forks = plan.start_kind is not None and plan.start_kind.copies_parent
    if "threads" in plan.facts.assumed and forks:
        from hwlaunch.planning.fork_safety import judge_threads
        from hwlaunch.planning.threads import probe_threads

        probed = probe_threads()
        if judge_threads(probed).fatal and not judge_threads(plan.facts.threads).fatal:
            claims.append(
                f"threads (assumed {plan.facts.threads.summary()}; this process has "
                f"{probed.summary()}, and forked workers would hang)"
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


def _find_spec(module: str) -> ModuleSpec | None:
    """The module's spec, found as ``import`` would find it but without running the module or
    its packages (an import in the driver would run user code there, and a fork would carry
    the result into every worker)."""
    path = None
    spec = None
    parts = module.split(".")
    for index in range(len(parts)):
        name = ".".join(parts[: index + 1])
        if name in sys.modules:
            spec = getattr(sys.modules[name], "__spec__", None)
        else:
            finders = (getattr(f, "find_spec", None) for f in sys.meta_path)
            found = (find(name, path) for find in finders if find is not None)
            spec = next((s for s in found if s is not None), None)
        if spec is None:
            return None
        path = spec.submodule_search_locations
    return spec


def _top_level_names(source: str) -> set[str] | None:
    """The names a module may bind at its top level (in ``if``/``try``/``with`` blocks too):
    definitions, imports, and every name another top-level statement mentions (more than it
    binds, so that only a name it cannot define is reported). None when that cannot be known
    without running it (a star import, a module ``__getattr__``)."""
    names: set[str] = set()
    statements = list(ast.parse(source).body)
    while statements:
        node = statements.pop()
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return None
        if isinstance(node, ast.If | ast.Try | ast.With):
            statements += [
                *node.body,
                *getattr(node, "orelse", []),
                *getattr(node, "finalbody", []),
            ]
            statements += [s for h in getattr(node, "handlers", []) for s in h.body]
        elif isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).partition(".")[0] for a in node.names)
        else:
            names.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
    return None if "__getattr__" in names else names


def check_extension_path(extension: type | str | None) -> None:
    """Check a ``"package.module:ClassName"`` worker extension in the driver, without running
    it: the module must be found and, where its source says, define the name. A typo is then
    one ConfigError naming it rather than a failure in every worker."""
    if not isinstance(extension, str):
        return
    where = f"worker_extension {extension!r}"
    if not _EXTENSION_PATH.match(extension):
        raise ConfigError(f"{where} is not an import path; write 'package.module:ClassName'")
    module, _, attr = extension.partition(":")
    spec = _find_spec(module)
    if spec is None:
        raise ConfigError(
            f"{where} cannot be imported: no module named {module!r} is installed or on "
            "sys.path here. Fix: install it (where the workers run too), or correct the path"
        )
    name = attr.partition(".")[0]
    loaded = sys.modules.get(module)
    if loaded is not None:
        names: set[str] | None = set(vars(loaded))
    elif spec.origin and spec.origin.endswith(".py") and os.path.isfile(spec.origin):
        with open(spec.origin, encoding="utf-8", errors="replace") as source:
            try:
                names = _top_level_names(source.read())
            except SyntaxError:
                names = None  # the workers' import reports it, with the line
    else:
        names = None  # compiled or frozen: only an import can tell
    if names is not None and name not in names:
        raise ConfigError(
            f"{where}: module {module!r} ({spec.origin}) defines no {name!r}"
            f"{did_you_mean(name, sorted(n for n in names if not n.startswith('_')))}"
        )
