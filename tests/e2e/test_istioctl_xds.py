"""The debug xDS types istioctl asks for, with the very requests istioctl sends (istioctl's
multixds/xds client is istiod's adsc: node `sidecar~IP~test-1.NS~NS.svc.cluster.local`, metadata
GENERATOR=event, SERVICE_ACCOUNT, NAMESPACE, ISTIO_VERSION 65536.65536.65536, a response_nonce
on the first request, a service-account token over TLS to 15012), answered about a real Envoy.

- `proxy-status`: type istio.io/debug/syncz, no names -> ClientConfig per proxy + ControlPlane id.
- `proxy-status POD.NS`: type istio.io/debug/config_dump, names [POD.NS] -> ConfigDump sections,
  which istioctl diffs against Envoy's own /config_dump.
- `x internal-debug PAGE`: type istio.io/debug, names [PAGE] -> the /debug page's body.
"""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest
from envoy.admin.v3 import config_dump_pb2, config_dump_shared_pb2
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.status.v3 import csds_pb2
from google.protobuf import struct_pb2

from pilot import version
from tests.e2e.mesh_config import endpoint_slice_yaml, fqdn, service_yaml
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(90)

SOTW = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
DELTA = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
SYNCZ = "istio.io/debug/syncz"
CONFIG_DUMP = "istio.io/debug/config_dump"
DEBUG = "istio.io/debug"
CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
LDS = "type.googleapis.com/envoy.config.listener.v3.Listener"
ENVOY_NODE = "sidecar~127.0.0.1~app-1.default~default.svc.cluster.local"
OTHER_NODE = "sidecar~10.0.0.9~db-1.other~other.svc.cluster.local"


def istioctl_node(namespace: str = "istio-system", sa: str = "default") -> base_pb2.Node:
    """adsc's node for istioctl (pkg/adsc buildNode + istioctl/pkg/xds GetXdsResponse)."""
    md = struct_pb2.Struct()
    md.update(
        {
            "GENERATOR": "event",
            "SERVICE_ACCOUNT": sa,
            "NAMESPACE": namespace,
            "ISTIO_VERSION": "65536.65536.65536",
        }
    )
    return base_pb2.Node(id=f"sidecar~10.1.2.3~test-1.{namespace}~{namespace}.svc.cluster.local", metadata=md)


def secure_channel(cp: ControlPlane) -> grpc.aio.Channel:
    return grpc.aio.secure_channel(
        f"127.0.0.1:{cp.secure_port}",
        grpc.ssl_channel_credentials(cp.root_cert().encode()),
        options=[("grpc.ssl_target_name_override", "istiod.istio-system.svc")],
    )


async def istioctl(
    channel: grpc.aio.Channel,
    type_url: str,
    names: list[str] | None = None,
    *,
    token: str | None = None,
    node: base_pb2.Node | None = None,
) -> discovery_pb2.DiscoveryResponse:
    """One request, one response, as istioctl's GetXdsResponse (adsc.Send sets a time nonce)."""
    call = channel.stream_stream(
        SOTW,
        request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
        response_deserializer=discovery_pb2.DiscoveryResponse.FromString,
    )(metadata=[("authorization", f"Bearer {token}")] if token else None)
    try:
        await call.write(
            discovery_pb2.DiscoveryRequest(
                node=node or istioctl_node(),
                type_url=type_url,
                resource_names=names or [],
                response_nonce=time.strftime("%Y-%m-%d %H:%M:%S.000000000 +0000 UTC m=+0.01"),
            )
        )
        return await asyncio.wait_for(call.read(), 10)
    finally:
        call.cancel()


async def refused(channel, type_url, names=None, **kw) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await istioctl(channel, type_url, names, **kw)
    return e.value.code(), e.value.details()


class Held:
    """A plain xDS client holding a stream open (a proxy of another namespace)."""

    def __init__(self, channel: grpc.aio.Channel, node_id: str) -> None:
        md = struct_pb2.Struct()
        md.update({"NAMESPACE": node_id.split("~")[2].rpartition(".")[2]})
        self.node = base_pb2.Node(id=node_id, metadata=md)
        self.call = channel.stream_stream(
            SOTW,
            request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DiscoveryResponse.FromString,
        )()

    async def subscribe(self) -> None:
        await self.call.write(discovery_pb2.DiscoveryRequest(node=self.node, type_url=CDS))
        resp = await asyncio.wait_for(self.call.read(), 10)
        await self.call.write(
            discovery_pb2.DiscoveryRequest(
                type_url=CDS, version_info=resp.version_info, response_nonce=resp.nonce
            )
        )


def client_configs(resp: discovery_pb2.DiscoveryResponse) -> dict[str, csds_pb2.ClientConfig]:
    out = {}
    for a in resp.resources:
        assert a.type_url == "type.googleapis.com/envoy.service.status.v3.ClientConfig"
        cc = csds_pb2.ClientConfig()
        a.Unpack(cc)
        out[cc.node.id] = cc
    return out


def dump_sections(resources) -> dict[str, object]:
    """The ConfigDump sections by message name (as istioctl's configdump.Wrapper finds them)."""
    sections = {}
    for a in resources:
        for cls in (
            config_dump_pb2.BootstrapConfigDump,
            config_dump_shared_pb2.ClustersConfigDump,
            config_dump_shared_pb2.ListenersConfigDump,
            config_dump_shared_pb2.RoutesConfigDump,
            config_dump_shared_pb2.ScopedRoutesConfigDump,
            config_dump_pb2.SecretsConfigDump,
            config_dump_shared_pb2.EcdsConfigDump,
            config_dump_shared_pb2.EndpointsConfigDump,
        ):
            if a.Is(cls.DESCRIPTOR):
                m = cls()
                a.Unpack(m)
                sections[cls.DESCRIPTOR.name] = m
    return sections


def unpack(a, cls):
    m = cls()
    assert a.Unpack(m)
    return m


def envoy_dynamic(dump: dict) -> dict[str, set[str]]:
    """Names of the dynamic clusters, listeners and route configs in Envoy's own /config_dump."""
    out = {"clusters": set(), "listeners": set(), "routes": set()}
    for c in dump["configs"]:
        t = c["@type"]
        if t.endswith("ClustersConfigDump"):
            out["clusters"] = {d["cluster"]["name"] for d in c.get("dynamic_active_clusters", [])}
        elif t.endswith("ListenersConfigDump"):
            out["listeners"] = {d["name"] for d in c.get("dynamic_listeners", []) if "active_state" in d}
        elif t.endswith("RoutesConfigDump") and "Scoped" not in t:
            out["routes"] = {d["route_config"]["name"] for d in c.get("dynamic_route_configs", [])}
    return out


def ours(sections) -> dict[str, set[str]]:
    return {
        "clusters": {
            unpack(d.cluster, cluster_pb2.Cluster).name
            for d in sections["ClustersConfigDump"].dynamic_active_clusters
        },
        "listeners": {
            unpack(d.active_state.listener, listener_pb2.Listener).name
            for d in sections["ListenersConfigDump"].dynamic_listeners
        },
        "routes": {
            unpack(d.route_config, route_pb2.RouteConfiguration).name
            for d in sections["RoutesConfigDump"].dynamic_route_configs
        },
    }


@pytest.fixture
async def mesh(tmp_path):
    issuer = Issuer("ES256")
    cp = ControlPlane(
        tmp_path,
        secure_grpc=True,
        env={"JWT_RULE": issuer.rule(), "CA_KEY_TYPE": "EC", "POD_NAME": "istiod-test-1"},
    )
    cp.write("svc.yaml", service_yaml("reviews", 9080) + "---\n" + endpoint_slice_yaml("reviews", 19080))
    envoy = Envoy()
    async with cp:
        await envoy.start(Envoy.bootstrap(ENVOY_NODE, cp.xds_port), tmp_path)
        try:
            await envoy.wait_ready()
            await cp.wait_synced(ENVOY_NODE)
            yield cp, envoy, issuer
        finally:
            await envoy.stop()


async def test_istioctl_proxy_status_and_diff_over_secure_xds(mesh):
    cp, envoy, issuer = mesh
    admin = issuer.token(
        namespace="istio-system", sa="default"
    )  # istioctl's token: default SA of istio-system
    async with secure_channel(cp) as ch, grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as plain:
        other = Held(plain, OTHER_NODE)
        await other.subscribe()

        # istioctl proxy-status: every proxy with its per-type sync state, and who answered.
        resp = await istioctl(ch, SYNCZ, token=admin)
        assert resp.type_url == SYNCZ and resp.version_info == await cp.push_version()
        cp_id = json.loads(resp.control_plane.identifier)
        assert cp_id["Component"] == "istiod" and cp_id["ID"] == "istiod-test-1"
        assert cp_id["Info"] == version.build_info() and set(cp_id["Info"]) == {
            "version",
            "revision",
            "golang_version",
            "status",
            "tag",
        }
        configs = client_configs(resp)
        assert set(configs) == {ENVOY_NODE, OTHER_NODE}, "istioctl's own stream is not a proxy"
        envoy_cc = configs[ENVOY_NODE]
        md = dict(envoy_cc.node.metadata.fields)
        assert md["NAMESPACE"].string_value == "default" and md["CLUSTER_ID"].string_value == "Kubernetes"
        status = {x.type_url: x.config_status for x in envoy_cc.generic_xds_configs}
        assert status[CDS] == csds_pb2.SYNCED and status[LDS] == csds_pb2.SYNCED, status
        assert all(s == csds_pb2.SYNCED for s in status.values()), status
        assert [x.type_url for x in envoy_cc.generic_xds_configs] == sorted(status)

        # istioctl proxy-status app-1.default: what we would send, diffable against Envoy's dump.
        resp = await istioctl(ch, CONFIG_DUMP, ["app-1.default"], token=admin)
        sections = dump_sections(resp.resources)
        assert {
            "BootstrapConfigDump",
            "ClustersConfigDump",
            "ListenersConfigDump",
            "RoutesConfigDump",
            "ScopedRoutesConfigDump",
            "SecretsConfigDump",
            "EcdsConfigDump",
        } <= set(sections)
        envoy_view = envoy_dynamic(await envoy.config_dump())
        assert ours(sections) == envoy_view
        assert f"outbound|9080||{fqdn('reviews')}" in envoy_view["clusters"]
        assert sections["ClustersConfigDump"].version_info == await cp.push_version()
        # A proxy not connected here: an empty answer (istioctl then asks the next replica).
        assert list((await istioctl(ch, CONFIG_DUMP, ["nope.nowhere"], token=admin)).resources) == []

        # istioctl x internal-debug syncz: the /debug page's body, over xDS.
        resp = await istioctl(ch, DEBUG, ["syncz"], token=admin)
        assert len(resp.resources) == 1 and resp.resources[0].type_url == DEBUG
        assert {row["proxy"] for row in json.loads(resp.resources[0].value)} >= {ENVOY_NODE, OTHER_NODE}
        code, why = await refused(ch, DEBUG, ["syncz", "adsz"], token=admin)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "exactly one" in why

        # A tenant identity (default/sleep) sees only its own namespace's proxies.
        tenant = issuer.token(namespace="default", sa="sleep")
        node = istioctl_node("default", "sleep")
        assert set(client_configs(await istioctl(ch, SYNCZ, token=tenant, node=node))) == {ENVOY_NODE}
        assert dump_sections(
            (await istioctl(ch, CONFIG_DUMP, ["app-1.default"], token=tenant, node=node)).resources
        )
        assert (
            list((await istioctl(ch, CONFIG_DUMP, ["db-1.other"], token=tenant, node=node)).resources) == []
        )
        code, why = await refused(ch, DEBUG, ["syncz"], token=tenant, node=node)
        assert code == grpc.StatusCode.PERMISSION_DENIED, why
        page = await istioctl(ch, DEBUG, ["config_dump?proxyID=app-1.default"], token=tenant, node=node)
        assert "ClustersConfigDump" in page.resources[0].value.decode()
        page = await istioctl(ch, DEBUG, ["config_dump?proxyID=db-1.other"], token=tenant, node=node)
        assert "Proxy not connected" in page.resources[0].value.decode()

        # Plaintext 15010 proves no identity: refused, as istiod (ENABLE_DEBUG_ENDPOINT_AUTH).
        for t in (SYNCZ, CONFIG_DUMP, DEBUG):
            code, why = await refused(plain, t, ["app-1.default"])
            assert (code, why) == (grpc.StatusCode.UNAUTHENTICATED, "authentication required"), t

        # A debug request starts no watch: the istioctl stream was never pushed nor counted as synced.
        assert ENVOY_NODE in {r["proxy"] for r in await cp.debug("/debug/syncz")}
        other.call.cancel()


async def test_debug_types_on_plaintext_when_debug_auth_is_off(tmp_path):
    cp = ControlPlane(tmp_path, env={"ENABLE_DEBUG_ENDPOINT_AUTH": "false"})
    cp.write("svc.yaml", service_yaml("reviews", 9080))
    async with cp, grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as plain:
        other = Held(plain, OTHER_NODE)
        await other.subscribe()
        assert set(client_configs(await istioctl(plain, SYNCZ))) == {OTHER_NODE}
        sections = dump_sections((await istioctl(plain, CONFIG_DUMP, ["db-1.other"])).resources)
        assert f"outbound|9080||{fqdn('reviews')}" in ours(sections)["clusters"]
        # `istio.io/debug` pages always need a proven identity (istiod's DebugGen).
        assert (await refused(plain, DEBUG, ["syncz"]))[0] == grpc.StatusCode.UNAUTHENTICATED
        # Delta clients get the same answer.
        call = plain.stream_stream(
            DELTA,
            request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString,
        )()
        await call.write(discovery_pb2.DeltaDiscoveryRequest(node=istioctl_node(), type_url=SYNCZ))
        resp = await asyncio.wait_for(call.read(), 10)
        assert [r.name for r in resp.resources] == [OTHER_NODE]
        assert json.loads(resp.control_plane.identifier)["Component"] == "istiod"
        call.cancel()
        other.call.cancel()


async def test_http_config_dump_has_envoys_shape_and_version_has_istiods(mesh):
    cp, envoy, _ = mesh
    status, text = await cp.get("/debug/config_dump")
    assert status == 400 and "proxyID is required" in text
    status, text = await cp.get("/debug/config_dump?proxyID=nope.nowhere")
    assert status == 404 and "Proxy not connected to this Pilot instance" in text

    dump = await cp.debug("/debug/config_dump?proxyID=app-1.default")
    types = [c["@type"].rpartition(".")[2] for c in dump["configs"]]
    assert types == [
        "BootstrapConfigDump",
        "ClustersConfigDump",
        "ListenersConfigDump",
        "ScopedRoutesConfigDump",
        "RoutesConfigDump",
        "SecretsConfigDump",
        "EcdsConfigDump",
    ]
    assert envoy_dynamic(dump) == envoy_dynamic(await envoy.config_dump())  # the same JSON shape as Envoy's
    with_eds = await cp.debug(f"/debug/config_dump?proxyID={ENVOY_NODE}&include_eds")
    eds = next(c for c in with_eds["configs"] if c["@type"].endswith("EndpointsConfigDump"))
    assert {e["endpoint_config"]["cluster_name"] for e in eds["dynamic_endpoint_configs"]} >= {
        f"outbound|9080||{fqdn('reviews')}"
    }

    info = json.loads((await cp.get("/version"))[1])
    assert info == version.build_info()
    assert set(info) == {"version", "revision", "golang_version", "status", "tag"}
    assert info["status"] in ("Clean", "Modified") and len(info["revision"]) == 40
