"""MeshConfig trustDomainAliases reach the generated RBAC: a principal or trust domain naming the
mesh (or an alias) matches every one of them, and editing the aliases rebuilds the listener."""

from __future__ import annotations

from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as http_rbac_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2

from tests.support.policies import authz
from tests.unit.test_mtls_generation import SIDECAR_POD, mesh_proxy, reviews_service, reviews_slice

from .helpers import World, mesh_configmap

LISTENER = "inbound_10.1.0.1_9080"


def rbac_text(world: World) -> tuple[bytes, str]:
    res = world.lds(mesh_proxy())[LISTENER]
    listener = res.message(listener_pb2.Listener)
    hcm = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    rbac = http_rbac_pb2.RBAC()
    [f] = [f for f in hcm.http_filters if f.name == "envoy.filters.http.rbac"]
    f.typed_config.Unpack(rbac)
    return res.any_bytes, str(rbac)


def test_aliases_expand_principals_and_trust_domains_and_are_a_cache_input() -> None:
    world = World()
    world.apply(reviews_service(), reviews_slice(), SIDECAR_POD,
                authz("from-front", selector={"matchLabels": {"app": "reviews"}}, rules=[
                    {"from": [{"source": {"principals": ["cluster.local/ns/default/sa/front"]}}]},
                    {"from": [{"source": {"trustDomains": ["new.td"]}}]}]),
                mesh_configmap({"trustDomain": "new.td"}))
    before, text = rbac_text(world)
    assert "spiffe://new.td/ns/default/sa/front" in text and "old.td" not in text

    world.apply(mesh_configmap({"trustDomain": "new.td", "trustDomainAliases": ["old.td"]}))
    after, text = rbac_text(world)
    assert after != before
    assert "spiffe://old.td/ns/default/sa/front" in text and "spiffe://new.td/ns/default/sa/front" in text
    assert 'prefix: "spiffe://old.td/"' in text and 'prefix: "spiffe://new.td/"' in text
    assert world.mesh.unsupported == ()  # applied, so not reported
