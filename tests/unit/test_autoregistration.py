"""pilot/autoregistration.py against a real Store: one entry per proxy IP however many streams it
opens, removal only after the last one closed, and a reconnect within the grace period keeps it."""

from __future__ import annotations

import dataclasses

import pytest

from pilot.agent import health
from pilot.autoregistration import DISCONNECTED_AT, AutoRegistration
from pilot.config.validation import parse_object
from pilot.model.store import ConfigKey, Store
from tests.support.wait import wait_for
from tests.unit.helpers import proxy

KEY = ConfigKey("WorkloadEntry", "vms", "db-10.1.1.1")


def vm():
    p = proxy("vms", ip="10.1.1.1", pod_name="db")
    return dataclasses.replace(p, metadata={**p.metadata, "AUTO_REGISTER_GROUP": "db", "LABELS": {"v": "1"}})


async def test_streams_are_counted_and_a_reconnect_within_the_grace_period_keeps_the_entry():
    store = Store()
    store.apply(parse_object({"apiVersion": "networking.istio.io/v1", "kind": "WorkloadGroup",
                              "metadata": {"name": "db", "namespace": "vms"},
                              "spec": {"template": {"labels": {"app": "db"}, "ports": {"tcp": 5432}}}}), "f.yaml")
    reg = AutoRegistration(store, grace_period=0.2)
    reg.connected(vm())
    reg.connected(vm())  # a second stream of the same proxy
    entry = store.get(KEY)
    assert entry is not None and entry.obj.spec.labels == {"app": "db", "v": "1"} and entry.obj.spec.ports == {"tcp": 5432}
    reg.disconnected(vm())
    assert DISCONNECTED_AT not in store.get(KEY).obj.metadata.annotations  # one stream is still open
    reg.disconnected(vm())
    assert DISCONNECTED_AT in store.get(KEY).obj.metadata.annotations
    reg.connected(vm())  # back within the grace period: the removal is cancelled
    assert DISCONNECTED_AT not in store.get(KEY).obj.metadata.annotations
    reg.disconnected(vm())
    await wait_for(lambda: store.get(KEY) is None, timeout=10, message="removed after the grace period")

    # A proxy naming a group that does not exist is served unregistered.
    stranger = dataclasses.replace(vm(), metadata={**vm().metadata, "AUTO_REGISTER_GROUP": "nope"})
    reg.connected(stranger)
    reg.disconnected(stranger)
    assert store.list("WorkloadEntry") == []
    reg.close()


def _store_with_group() -> Store:
    store = Store()
    store.apply(parse_object({"apiVersion": "networking.istio.io/v1", "kind": "WorkloadGroup",
                              "metadata": {"name": "db", "namespace": "vms"},
                              "spec": {"template": {"labels": {"app": "db"}}}}), "f.yaml")
    return store


async def test_health_reports_set_the_condition_only_for_health_checked_entries_and_only_on_change():
    store = _store_with_group()
    reg = AutoRegistration(store, grace_period=5, health_checks=True)
    plain = vm()
    reg.connected(plain)
    reg.health(plain, False, "down")  # no readinessProbe in its PROXY_CONFIG: not eligible
    assert store.get(KEY).obj.status is None and store.get(KEY).obj.is_healthy()
    reg.disconnected(plain)

    checked = dataclasses.replace(plain, metadata={**plain.metadata,
                                                   "PROXY_CONFIG": {"readinessProbe": {"tcpSocket": {"port": 5432}}}})
    reg.connected(checked)
    assert not store.get(KEY).obj.is_healthy()  # no report yet: not an endpoint (istiod's default)
    reg.health(checked, True, "")
    first = store.get(KEY)
    assert first.obj.is_healthy() and first.obj.status.conditions[0].status == "True"
    reg.health(checked, True, "")
    assert store.get(KEY) is first  # unchanged: nothing written, nothing pushed
    reg.health(checked, False, "connection refused")
    (cond,) = store.get(KEY).obj.status.conditions
    assert (cond.status, cond.message) == ("False", "connection refused") and not store.get(KEY).obj.is_healthy()
    reg.close()


def test_the_agent_refuses_an_exec_probe_and_fills_in_the_kubelet_defaults():
    with pytest.raises(health.ProbeConfigError, match="exec"):
        health.parse({"exec": {"command": ["true"]}})
    p = health.parse({"tcpSocket": {"port": 5432}})
    assert p is not None and (p.period, p.failure_threshold, p.success_threshold, p.prober.timeout) == (10, 3, 1, 1)
    assert p.prober.action["host"] == "localhost"
    assert health.parse(None) is None
    # The action is parsed as the injector's app probers are (one parser), naming the field.
    with pytest.raises(health.ProbeConfigError, match=r"readinessProbe\.timeoutSeconds"):
        health.parse({"tcpSocket": {"port": 5432}, "timeoutSeconds": "5s"})
    with pytest.raises(health.ProbeConfigError, match=r"readinessProbe\.httpGet\.port"):
        health.parse({"httpGet": {"port": "http"}})
