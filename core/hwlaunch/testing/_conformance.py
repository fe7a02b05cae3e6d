"""hwlaunch.testing: the conformance suite a backend plugin runs from its own pytest suite.

Subclass :class:`BackendConformance` in a test module and name the backend::

    from hwlaunch.testing import BackendConformance

    class TestAcme(BackendConformance):
        backend = "acme"
        vendor_modules = ("acme_runtime",)  # the probes must never import these
        absent_env = ("ACME_NPU_DEVICES=0",)  # how to make the device absent, if you can

pytest collects the subclass (its name starts with ``Test``) and runs every check below against
the installed plugin: registration, spec validation, probes without side effects (in a fresh
interpreter, through ``sys.modules``) and fast, a consistent start-method rule, the resolver's
plan against the rule (with facts assumed where the hardware is absent), and the worker's
lifecycle under each executor of ``executors`` as its declared capabilities say (skipped, with
the reason, where the device is absent).

This module imports pytest; ``import hwlaunch`` never imports it.
"""

from __future__ import annotations

from hwlaunch.testing._backend_lifecycle import LifecycleChecks, LifecycleProbe
from hwlaunch.testing._backend_rules import RuleChecks

__all__ = ["BackendConformance", "LifecycleProbe"]


class BackendConformance(RuleChecks, LifecycleChecks):
    """Conformance checks for one backend; subclass it as ``Test<Name>`` and set ``backend``.

    Class attributes to set:

    ``backend``
        The backend name, as the plugin registers it (required).
    ``assume``
        Facts assumed for the resolver checks when the device is absent, as ``--assume`` takes
        them: ``("acme.device_count=8",)`` (or a mapping); added to ``<backend>.available=true``
        and ``<backend>.device_count=2``.
    ``executors``
        The executors whose worker lifecycle is checked: ``("uni", "mp", "ray")`` by default;
        add your own executor's name to check your backend under it. What runs comes from each
        executor's declared capabilities, never its name: every start method the backend
        allows for one that declares ``start_method``, a real two-node cluster on 127.0.0.1
        for one that declares ``ray`` (skipped where Ray is not installed).
    ``vendor_modules``
        The vendor's runtime modules; like torch and Ray, the probes must not import them.
    ``absent_env``
        Environment variables under which the device is absent, if the plugin has such a
        switch, e.g. ``("ACME_NPU_DEVICES=0",)`` (or a mapping): the probe checks run there too.
    ``probe_imports_when_present``
        Modules the probes may import when the device is present (a cheap pre-check found it,
        so asking the runtime is allowed); never allowed where the device is absent.
    ``probe_budget_s``
        The median time one probe call may take (default 50 ms).
    """
