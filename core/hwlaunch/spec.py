"""BackendSpec: what a hardware plugin declares about its backend.

A spec is data, not behaviour: the resolver reads it, executors read the plan made from it, and
nothing in it touches a device when constructed. Validation happens here, at registration, so a
plugin author learns about a mistake from the registry and not from a worker that hangs later.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from types import MappingProxyType
from typing import Any, Literal

from hwlaunch import contract
from hwlaunch._checks import env_value_problem, is_env_name
from hwlaunch._start_methods import FORK, kind_of
from hwlaunch._start_methods import START_METHODS as START_METHODS  # the public names' home
from hwlaunch._start_methods import StartMethod as StartMethod
from hwlaunch.errors import PluginError

DeviceBinding = Literal["per_worker", "job_wide", "none"]
DEVICE_BINDINGS: tuple[DeviceBinding, ...] = ("per_worker", "job_wide", "none")

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_ENV_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\*?$")


def _fail(field_name: str, problem: str) -> PluginError:
    return PluginError(f"invalid BackendSpec field {field_name!r}: {problem}")


def _check_method(field_name: str, value: object) -> None:
    if value not in START_METHODS:
        raise _fail(field_name, f"{value!r} is not a start method; allowed: {list(START_METHODS)}")


@dataclass(frozen=True)
class StartMethodRule:
    """Which multiprocessing start methods a backend allows, and what to do when fork is unsafe.

    ``fallback`` is the method used instead of fork when fork is unsafe (device runtime already
    initialized, or running inside a Ray actor). ``fork_warning``, when set, is a warning the
    plan carries whenever fork is used (HPU: fork can hang at exit). ``preload`` names modules
    that the fork server imports once before forking workers, so forkserver starts fast.
    """

    allowed: tuple[StartMethod, ...]
    default: StartMethod
    fork_unsafe_after_init: bool = False
    fallback: StartMethod | None = None
    fork_warning: str | None = None
    preload: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.allowed, tuple) or not self.allowed:
            raise _fail("start_methods.allowed", "must be a non-empty tuple of start methods")
        for method in self.allowed:
            _check_method("start_methods.allowed", method)
        if len(set(self.allowed)) != len(self.allowed):
            raise _fail("start_methods.allowed", f"duplicate entries in {self.allowed!r}")
        _check_method("start_methods.default", self.default)
        if self.default not in self.allowed:
            raise _fail(
                "start_methods.default",
                f"{self.default!r} is not among allowed {list(self.allowed)}",
            )
        if not isinstance(self.fork_unsafe_after_init, bool):
            raise _fail("start_methods.fork_unsafe_after_init", "must be a bool")
        if self.fallback is not None:
            _check_method("start_methods.fallback", self.fallback)
            if kind_of(self.fallback).copies_parent or self.fallback not in self.allowed:
                raise _fail(
                    "start_methods.fallback",
                    f"{self.fallback!r} must be a non-fork method among allowed "
                    f"{list(self.allowed)}",
                )
        if self.fork_unsafe_after_init and FORK.name in self.allowed and self.fallback is None:
            raise _fail(
                "start_methods.fallback",
                "required when fork_unsafe_after_init is true (spawn or forkserver)",
            )
        if self.fork_warning is not None and not isinstance(self.fork_warning, str):
            raise _fail("start_methods.fork_warning", "must be a string or None")
        if not isinstance(self.preload, tuple) or not all(
            isinstance(m, str) and m for m in self.preload
        ):
            raise _fail("start_methods.preload", "must be a tuple of module names")


@dataclass(frozen=True)
class BackendSpec:
    """A hardware backend as a plugin declares it.

    The three probes must be cheap and free of side effects: they never initialize a device
    runtime, and import torch or a vendor module only when a cheap pre-check says it matters.
    ``worker`` is an import path ``"package.module:ClassName"``, imported only inside workers.

    ``device_binding`` says what each worker's ``device_control_env_var`` holds: ``per_worker``
    its own device only (the worker uses device index 0), ``job_wide`` every device of the job
    on its node (the worker selects ``local_rank``; for runtimes such as oneCCL on XPU that hang
    when each process sees a single device), ``none`` leaves the variable alone. Unset, it is
    ``job_wide`` when a visibility variable is named (what every plugin got before the field
    existed) and ``none`` otherwise. ``propagate_env`` names variables (``"NCCL_DEBUG"``) or
    prefixes (``"HABANA_*"``) copied from the driver's environment into every worker, Ray actors
    on other nodes included; the plan lists their names, never their values.
    ``ray_noset_visibility_var`` is the variable that stops Ray from rewriting the visibility
    variable in its actors (``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``), so that the
    binding above is the one that holds. ``contract`` is the plugin contract the spec needs.
    ``shutdown_timeout`` (contract 1.1) is the seconds the workers' own ``shutdown()`` gets
    before SIGTERM, for hardware whose teardown takes longer than the default 5 s; the
    ``shutdown_timeout`` setting wins over it.
    """

    name: str
    device_type: str
    priority: int
    is_available: Callable[[], bool]
    device_count: Callable[[], int]
    is_initialized: Callable[[], bool]
    start_methods: StartMethodRule
    dist_backend: str
    worker: str
    device_control_env_var: str | None = None
    ray_resource: str = "CPU"
    worker_env: Mapping[str, str] = field(default_factory=dict)
    device_binding: DeviceBinding | None = None
    propagate_env: tuple[str, ...] = ()
    ray_noset_visibility_var: str | None = None
    contract: str = contract.CONTRACT_VERSION
    shutdown_timeout: float | None = None  # contract 1.1

    def __post_init__(self) -> None:
        contract.require(self.contract, f"BackendSpec {self.name!r}")
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise _fail(
                "name",
                f"{self.name!r} must be a lowercase identifier like 'cuda' or 'my-npu' "
                "(letters, digits, '-', '_'; starting with a letter)",
            )
        if not isinstance(self.device_type, str) or not self.device_type:
            raise _fail("device_type", f"{self.device_type!r} must be a non-empty string")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise _fail("priority", f"{self.priority!r} must be an int")
        for probe in ("is_available", "device_count", "is_initialized"):
            if not callable(getattr(self, probe)):
                raise _fail(probe, "must be a callable taking no arguments")
        if not isinstance(self.start_methods, StartMethodRule):
            raise _fail("start_methods", "must be a hwlaunch.StartMethodRule")
        if not isinstance(self.dist_backend, str) or not self.dist_backend:
            raise _fail("dist_backend", f"{self.dist_backend!r} must be a non-empty string")
        if not isinstance(self.worker, str) or not _IMPORT_PATH.match(self.worker):
            raise _fail("worker", f"{self.worker!r} must be an import path 'package.module:Class'")
        var = self.device_control_env_var
        if var is not None and not is_env_name(var):
            raise _fail("device_control_env_var", f"{var!r} must be an environment variable name")
        if not isinstance(self.ray_resource, str) or not self.ray_resource:
            raise _fail("ray_resource", f"{self.ray_resource!r} must be a non-empty string")
        env: Any = self.worker_env
        if not isinstance(env, Mapping) or not all(is_env_name(k) for k in env):
            raise _fail("worker_env", "must map environment variable names to strings")
        for key, value in env.items():
            problem = env_value_problem(value)
            if problem is not None:
                raise _fail("worker_env", f"{key} = {problem}")
        object.__setattr__(self, "worker_env", MappingProxyType(dict(env)))
        self._check_binding()
        self._check_environment()
        self._warn_deprecated()

    def _check_binding(self) -> None:
        binding = self.device_binding
        if binding is None:
            binding = "job_wide" if self.device_control_env_var else "none"
            object.__setattr__(self, "device_binding", binding)
        if binding not in DEVICE_BINDINGS:
            raise _fail(
                "device_binding",
                f"{binding!r} is not a binding; allowed: {list(DEVICE_BINDINGS)}",
            )
        if binding != "none" and self.device_control_env_var is None:
            raise _fail(
                "device_binding",
                f"{binding!r} sets the device-visibility variable, but device_control_env_var "
                "is None. Fix: name the variable (e.g. 'CUDA_VISIBLE_DEVICES'), or use "
                "device_binding='none'",
            )

    def _check_environment(self) -> None:
        patterns: Any = self.propagate_env
        if isinstance(patterns, str) or not isinstance(patterns, (tuple, list)):
            raise _fail(
                "propagate_env",
                f"{patterns!r} must be a tuple of variable names or prefixes, "
                "e.g. ('HABANA_*', 'NCCL_DEBUG')",
            )
        for pattern in patterns:
            if not isinstance(pattern, str) or not _ENV_PATTERN.match(pattern):
                raise _fail(
                    "propagate_env",
                    f"{pattern!r} is neither a variable name ('NCCL_DEBUG') nor a prefix "
                    "ending in '*' ('HABANA_*')",
                )
        object.__setattr__(self, "propagate_env", tuple(patterns))
        var = self.ray_noset_visibility_var
        if var is not None and not is_env_name(var):
            raise _fail("ray_noset_visibility_var", f"{var!r} must be an environment variable name")
        grace: Any = self.shutdown_timeout
        if grace is not None and (
            isinstance(grace, bool) or not isinstance(grace, int | float) or not 0 < grace < 1e9
        ):
            raise _fail("shutdown_timeout", f"{grace!r} must be seconds > 0, or None")

    def _warn_deprecated(self) -> None:
        declared = {f.name: f for f in fields(self)}
        for name, instead in contract.DEPRECATED_FIELDS.items():
            spec_field = declared[name]
            default = (
                spec_field.default
                if spec_field.default is not MISSING
                else spec_field.default_factory()  # type: ignore[operator]
            )
            if getattr(self, name) != default:
                warnings.warn(
                    f"BackendSpec {self.name!r} sets {name!r}, which is deprecated: {instead}",
                    contract.HwlaunchDeprecationWarning,
                    stacklevel=4,
                )

    @property
    def is_accelerator(self) -> bool:
        """Whether devices are counted and bound per worker (everything but the host CPU)."""
        return self.device_type != "cpu"


def select_env(environ: Mapping[str, str], patterns: tuple[str, ...]) -> dict[str, str]:
    """The variables of ``environ`` that ``propagate_env`` patterns name: ``HABANA_*`` is a
    prefix, a plain name matches itself."""
    prefixes = tuple(p[:-1] for p in patterns if p.endswith("*"))
    names = {p for p in patterns if not p.endswith("*")}
    return {k: v for k, v in environ.items() if k in names or (prefixes and k.startswith(prefixes))}


def backend_aliases(specs: Mapping[str, BackendSpec]) -> dict[str, list[str]]:
    """Other words people use for backends, lowercased, and the backends each may mean: a
    spec's ``device_type`` and its ``ray_resource`` (``gpu`` means cuda or xpu, the backends
    that Ray counts as GPUs). Used only for did-you-mean hints."""
    aliases: dict[str, list[str]] = {}
    for name, spec in sorted(specs.items()):
        for word in {spec.device_type.lower(), spec.ray_resource.lower()} - {name}:
            aliases.setdefault(word, []).append(name)
    return aliases
