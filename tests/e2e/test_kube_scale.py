"""Scale figure (marked slow: `make bench` runs it): LIST and index 5,000 pods, 1,000 services
and 1,000 EndpointSlices from the fake apiserver; time to /ready and the server's memory."""

from __future__ import annotations

import json
import time

import psutil
import pytest

from tests.fakes.apiserver import FakeApiServer
from tests.support.control_plane import ControlPlane
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


async def test_list_and_index_a_large_cluster(tmp_path, capsys):
    fake = await FakeApiServer(history_limit=100_000).start()
    namespaces = [f"ns{i}" for i in range(20)]
    for ns in namespaces:
        fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    for i in range(1000):
        ns = namespaces[i % len(namespaces)]
        fake.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"svc{i}", "namespace": ns},
                     "spec": {"ports": [{"name": "http", "port": 8080}], "selector": {"app": f"svc{i}"}}})
        fake.create({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                     "metadata": {"name": f"svc{i}-1", "namespace": ns,
                                  "labels": {"kubernetes.io/service-name": f"svc{i}"}},
                     "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
                     "endpoints": [{"addresses": [f"10.{i // 250}.{i % 250}.{k}"], "conditions": {"ready": True}}
                                   for k in range(1, 6)]})
    for i in range(5000):
        ns = namespaces[i % len(namespaces)]
        fake.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"pod{i}", "namespace": ns,
                                                                     "labels": {"app": f"svc{i % 1000}"}},
                     "spec": {"serviceAccountName": "default", "nodeName": "node-1",
                              "containers": [{"name": "app", "image": "app:1"}]},
                     "status": {"podIP": f"10.{100 + i // 250}.{i % 250}.1", "phase": "Running"}})
    cp = ControlPlane(tmp_path, kubeconfig=fake.write_kubeconfig(tmp_path / "kc"),
                      env={"ENABLE_LEADER_ELECTION": "false"})
    try:
        t0 = time.monotonic()
        await cp.start_process_only(timeout=120)
        rss_idle = psutil.Process(cp.proc.pid).memory_info().rss

        async def ready() -> bool:
            return (await cp.get("/ready"))[0] == 200

        await wait_for(ready, timeout=120, interval=0.05)
        elapsed = time.monotonic() - t0
        rss = psutil.Process(cp.proc.pid).memory_info().rss
        services = await cp.debug("/debug/registryz")
        assert len([s for s in services if s["name"].startswith("svc")]) == 1000
        configz = await cp.debug("/debug/configz")
        assert sum(1 for c in configz["configs"] if c["kind"] == "Pod") == 5000
        with capsys.disabled():
            print("\nFIGURES " + json.dumps({"kube_list_5000_pods_1000_svc_1000_slices": {
                "start_to_ready_s": round(elapsed, 2), "rss_mb": round(rss / 2**20, 1),
                "rss_before_lists_mb": round(rss_idle / 2**20, 1)}}))
    finally:
        await cp.stop()
        await fake.stop()
