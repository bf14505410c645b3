"""WorkloadEntry health checks (PILOT_ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS) end to end: the
WorkloadGroup's probe goes into mesh.yaml as `pilotctl x workload entry configure` writes it, the
real VM-style pilot-agent auto-registers over its xDS proxy, probes a loopback app and reports over
that stream (istio.io/health); the entry's Healthy condition and its EDS endpoint follow the app."""

from __future__ import annotations

from typing import Self

import pytest
import yaml
from aiohttp import web

from pilot.config.validation import InvalidObject, parse_object
from pilot.pilotctl.workload import files_for
from tests.e2e.test_pilot_agent import NAMESPACE, SA, agent, plane
from tests.support.backends import serve
from tests.support.wait import wait_for
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(120)
HOST = f"billing.{NAMESPACE}.svc.cluster.local"
ENTRY = "billing-vm-127.0.0.1"


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    return Issuer("ES256")


class App:
    """A loopback app whose /healthz answers 200 or 503 as the test says."""

    def __init__(self) -> None:
        self.healthy = True
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503, text="ok" if self.healthy else "down")

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_get("/healthz", self._health)
        self._runner, self.port = await serve(app)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


def group(app_port: int, probe: dict | None = None) -> dict:
    return {"apiVersion": "networking.istio.io/v1", "kind": "WorkloadGroup",
            "metadata": {"name": "billing-vm", "namespace": NAMESPACE},
            "spec": {"metadata": {"labels": {"app": "billing"}},
                     "template": {"ports": {"http": app_port}, "serviceAccount": SA},
                     "probe": probe or {"periodSeconds": 1, "failureThreshold": 1,
                                        "httpGet": {"path": "/healthz", "port": app_port}}}}


def service(app_port: int) -> dict:
    return {"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
            "metadata": {"name": "billing", "namespace": NAMESPACE},
            "spec": {"hosts": [HOST], "location": "MESH_INTERNAL", "resolution": "STATIC",
                     "ports": [{"number": 80, "name": "http", "protocol": "HTTP", "targetPort": app_port}],
                     "workloadSelector": {"labels": {"app": "billing"}}}}


async def condition(cp) -> str | None:
    """The entry's Healthy status ("True"/"False"), "unset" before any report, None: no entry."""
    for c in (await cp.debug("/debug/configz"))["configs"]:
        if c["kind"] == "WorkloadEntry" and c["name"] == ENTRY:
            conds = (c["object"].get("status") or {}).get("conditions") or []
            return next((x["status"] for x in conds if x["type"] == "Healthy"), "unset")
    return None


async def endpoints(cp) -> list[tuple[str, int]]:
    return [(e["address"], e["port"]) for row in await cp.debug("/debug/endpointz")
            if row["service"] == HOST for e in row["endpoints"]]


async def envoy_endpoints(a) -> list[tuple[str, int]]:
    """What a consumer's Envoy (here the VM's own, a client of the service too) holds over EDS."""
    clusters = (await a.admin_json("/clusters?format=json"))["cluster_statuses"]
    return [(h["address"]["socket_address"]["address"], h["address"]["socket_address"]["port_value"])
            for c in clusters if c["name"] == f"outbound|80||{HOST}" for h in c.get("host_statuses") or []]


async def test_the_entry_and_its_endpoint_follow_the_vm_probe(tmp_path, issuer):
    async with App() as app, plane(tmp_path, issuer) as cp:
        wg = group(app.port)
        cp.write("vm.yaml", yaml.safe_dump_all([wg, service(app.port)]))
        files = files_for(parse_object(wg), "trustDomain: example.org\n", cp.root_cert(), "", cluster_id="Kubernetes",
                          revision="", istio_namespace="istio-system", ingress_ip="", internal_ip="",
                          autoregister=True, dns_capture=False)
        assert yaml.safe_load(files["mesh.yaml"])["defaultConfig"]["readinessProbe"]["httpGet"]["port"] == app.port
        a = agent(tmp_path, cp, issuer)
        a._write("etc/istio/config/mesh", files["mesh.yaml"])
        async with a:
            await a.wait_ready()
            await wait_for(lambda: is_(condition(cp), "True"), timeout=30,
                           message=f"the entry is registered healthy\n{a.log_tail()}\n{cp.log_tail()}")
            await wait_for(lambda: is_(endpoints(cp), [("127.0.0.1", app.port)]), timeout=20,
                           message="the healthy VM is an endpoint")
            await wait_for(lambda: is_(envoy_endpoints(a), [("127.0.0.1", app.port)]), timeout=20,
                           message="the healthy VM is an endpoint in Envoy")

            app.healthy = False
            await wait_for(lambda: is_(condition(cp), "False"), timeout=20,
                           message=f"the failing probe is reported\n{a.log_tail()}")
            await wait_for(lambda: is_(endpoints(cp), []), timeout=20, message="the unhealthy VM is no endpoint")
            await wait_for(lambda: is_(envoy_endpoints(a), []), timeout=20,
                           message="the unhealthy VM left the consumer's EDS")
            entry = next(c for c in (await cp.debug("/debug/configz"))["configs"] if c["name"] == ENTRY)
            (cond,) = entry["object"]["status"]["conditions"]
            assert "503" in cond["message"], cond

            app.healthy = True
            await wait_for(lambda: is_(condition(cp), "True"), timeout=20, message="recovery is reported")
            await wait_for(lambda: is_(endpoints(cp), [("127.0.0.1", app.port)]), timeout=20,
                           message="the recovered VM is an endpoint again")
            await wait_for(lambda: is_(envoy_endpoints(a), [("127.0.0.1", app.port)]), timeout=20,
                           message="the recovered VM is back in the consumer's EDS")


async def is_(value, want) -> bool:
    return await value == want


def test_an_exec_probe_is_refused_with_its_path():
    with pytest.raises(InvalidObject, match=r"probe.*exec"):
        parse_object(group(8080, {"exec": {"command": ["true"]}}))
    with pytest.raises(InvalidObject, match="exactly one of httpGet, tcpSocket, grpc"):
        parse_object(group(8080, {"httpGet": {"port": 1}, "tcpSocket": {"port": 2}}))
