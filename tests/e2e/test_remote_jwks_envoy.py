"""PILOT_JWT_ENABLE_REMOTE_JWKS through a real Envoy: with `hybrid` (or `envoy`), a
RequestAuthentication whose jwksUri names a mesh service gets `remote_jwks` through that service's
outbound cluster, and Envoy itself fetches the keys and verifies tokens with them; with istiod's
default (`false`) and nothing fetched by the control plane, the keys are the inline unmatchable
set, so the same valid token is refused.

The filters come from the real pipeline (PushContext from a Store, the inbound filter builder);
they sit in a static Envoy (tests/support/static_config.policy_bootstrap) whose cluster
`outbound|PORT||jwks.default.svc.cluster.local` points at the test's JWKS server."""

from __future__ import annotations

import aiohttp
import pytest

from pilot.config.mesh import MeshConfig
from pilot.features import Features
from pilot.model.push_context import PushContext
from pilot.networking.policy_filters import inbound_http_filters
from tests.e2e.test_tcp_tls_routes import TcpBackend
from tests.support.backends import HttpBackend
from tests.support.envoy import Envoy
from tests.support.policies import request_authn, store_of
from tests.support.static_config import _static_cluster, policy_bootstrap
from tests.unit.test_authn import Issuer
from tests.unit.test_jwks_resolver import IssuerServer

pytestmark = pytest.mark.timeout(90)

HOST = "jwks.default.svc.cluster.local"


def filters(mode: str, port: int, issuer: Issuer) -> list:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "jwks", "namespace": "default"},
               "spec": {"clusterIP": "10.0.0.77", "ports": [{"name": "http", "port": port}]}}
    ra = request_authn("jwt", "default", selector={"matchLabels": {"app": "web"}},
                       jwtRules=[{"issuer": issuer.issuer, "jwksUri": f"http://{HOST}:{port}/jwks"}])
    knobs = Features.from_env({"PILOT_JWT_ENABLE_REMOTE_JWKS": mode}).generation_knobs()
    ctx = PushContext.build(store_of(service, ra), MeshConfig(), "m1", "cluster.local", "v1", knobs=knobs)
    return inbound_http_filters(ctx.workload_policies("default", {"app": "web"}), "cluster.local")


async def status(url: str, token: str | None) -> int:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s, s.get(url, headers=headers) as r:
        return r.status


@pytest.mark.parametrize("mode", ["hybrid", "true", "envoy", "false"])
async def test_envoy_fetches_the_keys_itself_in_remote_modes(tmp_path, mode: str):
    issuer = Issuer("RS256", issuer="https://issuer.example.com")
    keys = await IssuerServer().start()
    keys.jwks = issuer.jwks
    port = int(keys.base.rsplit(":", 1)[1])
    app, db = await HttpBackend("app").start(), await TcpBackend("db").start()
    config = policy_bootstrap(filters(mode, port, issuer), [], app.port, db.port)
    config["static_resources"]["clusters"].append(_static_cluster(f"outbound|{port}||{HOST}", port))
    envoy = Envoy()
    try:
        await envoy.start(config, tmp_path)
        await envoy.wait_ready()
        url = f"http://127.0.0.1:{(await envoy.listener_ports())['http']}/"
        valid = issuer.token()
        forged = Issuer("RS256", issuer=issuer.issuer).token()  # right issuer, wrong key
        if mode == "false":
            # istiod fetches (here: nothing fetched yet): no token of this issuer verifies.
            assert await status(url, valid) == 401
            assert "/jwks" not in keys.hits
        else:
            assert await status(url, valid) == 200
            assert "/jwks" in keys.hits  # Envoy fetched them, through the service's cluster
        assert await status(url, forged) == 401
        assert await status(url, None) == 200  # no token: RequestAuthentication alone lets it pass
    finally:
        await envoy.stop()
        await app.stop()
        db.server.close()  # type: ignore[union-attr]
        await keys.stop()
