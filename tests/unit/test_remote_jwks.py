"""PILOT_JWT_ENABLE_REMOTE_JWKS: who fetches a jwksUri's keys, as istiod's policy_applier decides."""

from __future__ import annotations

import pytest
from envoy.extensions.filters.http.jwt_authn.v3 import config_pb2 as jwt_pb2

from pilot.config.mesh import MeshConfig
from pilot.features import Features
from pilot.model.push_context import PushContext
from pilot.model.security_policies import JwksSnapshot
from pilot.networking.jwt_authn import jwt_authn_config
from tests.support.policies import request_authn, store_of

SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "keys", "namespace": "auth"},
           "spec": {"clusterIP": "10.0.0.8", "ports": [{"name": "http", "port": 8080}]}}
MESH_URI = "http://keys.auth.svc.cluster.local:8080/jwks"
OUTSIDE_URI = "https://login.example.com/jwks"


def providers(mode: str) -> dict[str, jwt_pb2.JwtProvider]:
    ra = request_authn("jwt", "default", jwtRules=[{"issuer": "mesh", "jwksUri": MESH_URI},
                                                   {"issuer": "outside", "jwksUri": OUTSIDE_URI,
                                                    "timeout": "2s"}])
    knobs = Features.from_env({"PILOT_JWT_ENABLE_REMOTE_JWKS": mode}).generation_knobs()
    ctx = PushContext.build(store_of(SERVICE, ra), MeshConfig(), "m1", "cluster.local", "v1", knobs=knobs,
                            jwks=JwksSnapshot(keys={OUTSIDE_URI: '{"keys":[]}', MESH_URI: '{"keys":[]}'}))
    config = jwt_authn_config(ctx.workload_policies("default", {}))
    assert config is not None
    return {p.issuer: p for p in config.providers.values()}


@pytest.mark.parametrize("mode", ["false", "istiod", "bogus"])
def test_istiod_fetches_by_default(mode: str):
    got = providers(mode)
    assert all(p.WhichOneof("jwks_source_specifier") == "local_jwks" for p in got.values())


@pytest.mark.parametrize("mode", ["hybrid", "true"])
def test_hybrid_lets_envoy_fetch_from_mesh_services_only(mode: str):
    got = providers(mode)
    assert got["mesh"].remote_jwks.http_uri.cluster == "outbound|8080||keys.auth.svc.cluster.local"
    assert got["mesh"].remote_jwks.http_uri.timeout.seconds == 5
    assert got["mesh"].remote_jwks.cache_duration.seconds == 300
    assert got["outside"].local_jwks.inline_string == '{"keys":[]}'  # falls back to the fetched keys


def test_envoy_mode_always_lets_envoy_fetch():
    got = providers("envoy")
    assert got["outside"].remote_jwks.http_uri.cluster == "outbound|443||login.example.com"
    assert got["outside"].remote_jwks.http_uri.timeout.seconds == 2
    assert got["mesh"].remote_jwks.http_uri.cluster == "outbound|8080||keys.auth.svc.cluster.local"
