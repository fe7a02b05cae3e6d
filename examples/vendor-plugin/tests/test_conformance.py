"""The Acme plugin's tests: hwlaunch's conformance suite, plus what is special to Acme.

Run them after installing the plugin: ``pip install -e . && pytest``.
"""

from __future__ import annotations

import os

import pytest

import hwlaunch
from hwlaunch.testing import BackendConformance


class TestAcme(BackendConformance):
    """Every check of the suite, against the installed "acme" backend."""

    backend = "acme"
    vendor_modules = ("acme_runtime",)  # the probes must never import the vendor runtime
    absent_env = ("ACME_NPU_DEVICES=0",)  # the emulation's switch for "no device here"


def test_each_rank_binds_its_own_visible_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Acme-specific: with ACME_VISIBLE_DEVICES=3,5 rank 0 binds NPU 3 and rank 1 NPU 5."""
    monkeypatch.setenv("ACME_NPU_DEVICES", "8")
    monkeypatch.setenv("ACME_VISIBLE_DEVICES", "3,5")
    plan = hwlaunch.resolve(backend="acme", world_size=2)  # mp, forkserver: the rule's default
    assert plan.device_binding == "job_wide"
    with hwlaunch.launch(plan) as workers:
        assert workers.collective_rpc("bound_device") == ["3", "5"]
        # job_wide: every worker sees the job's devices
        assert workers.collective_rpc(lambda w: os.environ["ACME_VISIBLE_DEVICES"]) == ["3,5"] * 2
        # the setup hook registered the ops once in each worker process, before init_device
        assert workers.collective_rpc("ops_registered") == [1, 1]


def test_policy_sets_comm_channels_unless_the_user_did(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = hwlaunch.resolve(backend="acme", world_size=2)
    assert plan.env["ACME_COMM_CHANNELS"] == "2"
    assert "plugin acme" in plan.decision("env").source
    monkeypatch.setenv("ACME_COMM_CHANNELS", "7")  # the user's own setting wins
    plan = hwlaunch.resolve(backend="acme", world_size=2)
    assert "ACME_COMM_CHANNELS" not in plan.env
    assert any("ACME_COMM_CHANNELS" in w and "plugin acme" in w for w in plan.warnings)


def test_runtime_variables_reach_workers_by_name_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACME_RT_QUEUE_DEPTH", "6464-queue")
    plan = hwlaunch.resolve(backend="acme", world_size=2)
    assert plan.decision("propagate_env").value == ["ACME_RT_QUEUE_DEPTH"]
    assert "6464-queue" not in plan.explain()
    with hwlaunch.launch(plan) as workers:
        got = workers.collective_rpc(lambda w: os.environ.get("ACME_RT_QUEUE_DEPTH"))
    assert got == ["6464-queue", "6464-queue"]
