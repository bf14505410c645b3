"""Pushes follow what config read, seen from Envoy's own admin API (not the server's view).

1. A DestinationRule subset selects by Pod labels. The EndpointSlice names a Pod that does not
   exist yet; when the Pod arrives, Envoy's `outbound|PORT|v1|reviews...` gains its host.
   (Before dependency recording nothing was pushed until some unrelated change, while
   /debug/explain said up_to_date and listed no Pod among the inputs.)
2. A sidecar with a mesh identity (pilot-agent on 15012) under a Sidecar whose egress names only
   ratings: when its own Service's targetPort moves, its inbound listener moves with it. (The
   Sidecar hides that Service from its *outbound* view; the inbound side still reads it.)
3. Sidecars of two namespaces share one CDS walk per service within a push: a WorkloadEntry that
   only the walk reads (a DNS ServiceEntry's endpoint) reaches the Envoy that got the walk from
   the memo too (it failed with the memo's Deps not handed to later callers).
"""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.e2e.mtls_mesh import NS
from tests.support.agent import PilotAgent
from tests.support.backends import HttpBackend
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_ports
from tests.support.wait import wait_for
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(90)
REVIEWS = "reviews.default.svc.cluster.local"
NODE = sidecar_node_id("client-1")


def reviews_yaml(app_port: int) -> str:
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: reviews, namespace: default}}
        spec:
          selector: {{app: reviews}}
          ports: [{{name: http, port: 9080, targetPort: {app_port}}}]
        ---
        apiVersion: discovery.k8s.io/v1
        kind: EndpointSlice
        metadata:
          name: reviews-1
          namespace: default
          labels: {{kubernetes.io/service-name: reviews}}
        addressType: IPv4
        ports: [{{name: http, port: {app_port}}}]
        endpoints:
        - addresses: [127.0.0.1]
          conditions: {{ready: true}}
          targetRef: {{kind: Pod, name: reviews-v1, namespace: default}}
        ---
        apiVersion: networking.istio.io/v1
        kind: DestinationRule
        metadata: {{name: reviews, namespace: default}}
        spec:
          host: reviews
          subsets: [{{name: v1, labels: {{version: v1}}}}]
        """)


POD_YAML = textwrap.dedent("""\
    apiVersion: v1
    kind: Pod
    metadata:
      name: reviews-v1
      namespace: default
      labels: {app: reviews, version: v1}
    spec: {serviceAccountName: reviews}
    status: {podIP: 127.0.0.1, phase: Running}
    """)


def hosts_of(clusters: dict, name: str) -> list[str] | None:
    """Envoy's own view (/clusters): the host addresses of one cluster, None if it has none."""
    for c in clusters.get("cluster_statuses", []):
        if c["name"] == name:
            socks = [h["address"]["socket_address"] for h in c.get("host_statuses", [])]
            return [f"{a['address']}:{a['port_value']}" for a in socks]
    return None


async def test_pod_arriving_after_its_endpoint_slice_fills_the_subset_cluster(tmp_path):
    backend = HttpBackend("reviews-v1")
    await backend.start()
    cp = ControlPlane(tmp_path)
    cp.write("reviews.yaml", reviews_yaml(backend.port))
    envoy = Envoy()
    subset = f"outbound|9080|v1|{REVIEWS}"
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(NODE, cp.xds_port), tmp_path)

        async def subset_hosts():
            return hosts_of(await envoy.clusters(), subset)

        # The subset cluster is there and empty: its endpoint's Pod (and so its labels) is unknown.
        async def present():
            return await subset_hosts() is not None

        await wait_for(present, timeout=20, message=f"{subset} in Envoy\n{cp.log_tail()}")
        await cp.wait_synced(NODE)
        assert await subset_hosts() == []

        cp.write("pod.yaml", POD_YAML)

        async def filled():
            hosts = await subset_hosts()
            return hosts if hosts else None

        hosts = await wait_for(filled, timeout=20,
                               message=f"{subset} gets the Pod's endpoint\n{cp.log_tail()}")
        assert hosts == [f"127.0.0.1:{backend.port}"]
        # /debug/explain lists the Pod among the CLA's inputs, and Envoy holds the current version.
        ex = await cp.debug(f"/debug/explain?proxyID={NODE}&type=eds&name={subset}")
        assert "Pod/default/reviews-v1" in ex["inputs"], ex["inputs"]
        assert ("Pod", "reviews-v1") in {(o["kind"], o["name"]) for o in ex["built_from"]}

        async def up_to_date():
            e = await cp.debug(f"/debug/explain?proxyID={NODE}&type=eds&name={subset}")
            return e if e["proxy_holds"]["up_to_date"] else None

        await wait_for(up_to_date, timeout=10, message="explain: the proxy holds the current CLA")
    finally:
        await envoy.stop()
        await cp.stop()
        await backend.stop()


def scoped_mesh_yaml(target_port: int) -> str:
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: productpage, namespace: {NS}}}
        spec:
          selector: {{app: productpage}}
          ports: [{{name: http, port: 9080, targetPort: {target_port}}}]
        ---
        apiVersion: v1
        kind: Service
        metadata: {{name: ratings, namespace: {NS}}}
        spec:
          selector: {{app: ratings}}
          ports: [{{name: http, port: 9080, targetPort: 9080}}]
        ---
        apiVersion: networking.istio.io/v1
        kind: Sidecar
        metadata: {{name: productpage, namespace: {NS}}}
        spec:
          workloadSelector: {{labels: {{app: productpage}}}}
          egress: [{{hosts: ["./ratings.{NS}.svc.cluster.local"]}}]
        """)


PRODUCTPAGE_IP = "127.0.0.7"


async def inbound_ports(agent: PilotAgent) -> set[int]:
    """The ports of the listeners Envoy itself reports bound on the workload's address."""
    listeners = await agent.admin_json("/listeners?format=json")
    out = set()
    for status in listeners.get("listener_statuses", []):
        sock = status.get("local_address", {}).get("socket_address", {})
        if sock.get("address") == PRODUCTPAGE_IP:
            out.add(int(sock["port_value"]))
    return out


async def test_own_service_target_port_moves_the_inbound_listener_of_a_scoped_mtls_sidecar(tmp_path):
    old_port, new_port = free_ports(2)
    issuer = Issuer("ES256")
    cp = ControlPlane(tmp_path / "cp", secure_grpc=True, env={"JWT_RULE": issuer.rule()})
    cp.write("mesh.yaml", scoped_mesh_yaml(old_port))
    env = {"POD_NAME": "productpage-1", "POD_NAMESPACE": NS, "SERVICE_ACCOUNT": "productpage",
           "INSTANCE_IP": PRODUCTPAGE_IP, "ISTIO_META_INTERCEPTION_MODE": "NONE",
           "ISTIO_METAJSON_LABELS": json.dumps({"app": "productpage"})}
    agent = PilotAgent(tmp_path / "productpage", env=env)
    try:
        await cp.start()
        agent.env["PROXY_CONFIG"] = json.dumps({"discoveryAddress": f"127.0.0.1:{cp.secure_port}",
                                                "proxyAdminPort": 0, "statusPort": 0, "concurrency": 1})
        agent.write_root_cert(cp.root_cert())
        agent.write_token(issuer.token(namespace=NS, sa="productpage"))
        await agent.start()
        await agent.wait_ready()

        async def listening_on(port: int):
            try:
                ports = await inbound_ports(agent)
            except (AssertionError, KeyError, OSError):
                return None
            return ports if port in ports else None

        await wait_for(lambda: listening_on(old_port), timeout=20,
                       message=f"inbound listener on {old_port}\n{cp.log_tail()}\n{agent.log_tail(20)}")
        cp.write("mesh.yaml", scoped_mesh_yaml(new_port))
        ports = await wait_for(lambda: listening_on(new_port), timeout=20,
                               message=f"inbound listener moves to {new_port}\n{cp.log_tail()}\n"
                                       f"{agent.log_tail(20)}")
        assert old_port not in ports
        # Envoy's own config dump agrees: the inbound listener's address is the new targetPort.
        dump = await agent.admin_json("/config_dump?resource=dynamic_listeners")
        addrs = {(lis["active_state"]["listener"]["address"]["socket_address"]["address"],
                  lis["active_state"]["listener"]["address"]["socket_address"].get("port_value"))
                 for lis in (c for c in dump["configs"]) if "active_state" in lis}
        assert (PRODUCTPAGE_IP, new_port) in addrs and (PRODUCTPAGE_IP, old_port) not in addrs
    finally:
        await agent.stop()
        await cp.stop()


def dns_entry_yaml(*addresses: str) -> str:
    """A DNS ServiceEntry whose endpoints are the WorkloadEntries it selects (one per address)."""
    entries = "".join(textwrap.dedent(f"""\
        ---
        apiVersion: networking.istio.io/v1
        kind: WorkloadEntry
        metadata: {{name: api-{i}, namespace: default}}
        spec: {{address: {a}, labels: {{app: api}}}}
        """) for i, a in enumerate(addresses))
    return textwrap.dedent("""\
        apiVersion: networking.istio.io/v1
        kind: ServiceEntry
        metadata: {name: api, namespace: default}
        spec:
          hosts: [api.internal.example]
          location: MESH_INTERNAL
          resolution: DNS
          ports: [{number: 8080, name: http, protocol: HTTP}]
          workloadSelector: {labels: {app: api}}
        """) + entries


async def dns_cluster_addresses(envoy: Envoy, name: str) -> list[str] | None:
    """Envoy's /config_dump: the addresses a STRICT_DNS cluster resolves, None without it."""
    dump = await envoy.config_dump(resource="dynamic_active_clusters")
    for c in dump.get("configs", []):
        cluster = c.get("cluster", {})
        if cluster.get("name") == name:
            return sorted(lb["endpoint"]["address"]["socket_address"]["address"]
                          for group in cluster.get("load_assignment", {}).get("endpoints", [])
                          for lb in group.get("lb_endpoints", []))
    return None


async def test_a_workload_entry_change_reaches_every_namespace_sharing_the_cds_walk(tmp_path):
    """Two sidecars of different namespaces share, within a push, one CDS walk per service
    (ctx.memoized): the second one generated gets the first one's clusters and its recorded
    reads. A WorkloadEntry only that walk reads (the endpoints of a DNS ServiceEntry) must
    still reach both Envoys: the one that connected second depends on it through the memo."""
    cluster = "outbound|8080||api.internal.example"
    nodes = (sidecar_node_id("client-1", "default"), sidecar_node_id("client-2", "shop"))
    cp = ControlPlane(tmp_path)
    cp.write("api.yaml", dns_entry_yaml("127.0.0.1"))
    envoys = [Envoy(), Envoy()]
    try:
        await cp.start()
        for envoy, node in zip(envoys, nodes, strict=True):  # one after the other: the second is a memo hit
            await envoy.start(Envoy.bootstrap(node, cp.xds_port), tmp_path)
            await cp.wait_synced(node, types=("cluster", "listener"), timeout=20)
        for envoy in envoys:
            assert await dns_cluster_addresses(envoy, cluster) == ["127.0.0.1"]

        cp.write("api.yaml", dns_entry_yaml("127.0.0.1", "127.0.0.2"))
        for envoy, node in zip(envoys, nodes, strict=True):
            async def both(envoy=envoy):
                got = await dns_cluster_addresses(envoy, cluster)
                return got if got == ["127.0.0.1", "127.0.0.2"] else None

            await wait_for(both, timeout=20, message=f"{node}: {cluster} resolves the new WorkloadEntry\n"
                                                     f"{cp.log_tail()}")
    finally:
        for envoy in envoys:
            await envoy.stop()
        await cp.stop()
