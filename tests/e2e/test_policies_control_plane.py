"""Security policies in the running control plane (file mode): accepted, rejected with the reason,
listed as unsupported where they cannot be applied as written, and a change is a full push."""

from __future__ import annotations

import pytest
import yaml

from tests.support.control_plane import ControlPlane
from tests.support.policies import authz, peer_authn, request_authn
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(60)


def dump(*docs: dict) -> str:
    return yaml.safe_dump_all(docs)


async def test_policies_in_configz_and_a_change_pushes(tmp_path):
    cp = ControlPlane(tmp_path)
    cp.write("policies.yaml", dump(
        peer_authn("strict", "shop", mtls={"mode": "STRICT"}),
        authz("allow-get", "shop", rules=[{"to": [{"operation": {"methods": ["GET"]}}]}]),
        authz("ext", "shop", action="CUSTOM", provider={"name": "opa"}, rules=[{}]),
        request_authn("remote", "shop", jwtRules=[{"issuer": "https://iss", "jwksUri": "https://iss/keys"}]),
        authz("broken", "shop", rules=[{"when": [{"key": "destination.labels[app]", "values": ["x"]}]}])))
    async with cp:
        configz = await cp.debug("/debug/configz")
        assert {(c["kind"], c["name"]) for c in configz["configs"] if c["namespace"] == "shop"} == {
            ("PeerAuthentication", "strict"), ("AuthorizationPolicy", "allow-get"), ("AuthorizationPolicy", "ext"),
            ("RequestAuthentication", "remote")}
        [rejected] = configz["rejected"]
        assert rejected["name"] == "broken" and "replaced by the workload selector" in rejected["reason"]
        unsupported = {(u["kind"], u["name"]): u["reason"] for u in configz["unsupported"]}
        assert set(unsupported) == {("AuthorizationPolicy", "ext"), ("RequestAuthentication", "remote")}
        assert "requests to the selected workloads are denied" in unsupported[("AuthorizationPolicy", "ext")]

        cp.write("more.yaml", dump(authz("deny-admin", "shop", action="DENY",
                                         rules=[{"to": [{"operation": {"paths": ["/admin"]}}]}])))

        async def pushed() -> dict | None:
            status = await cp.debug("/debug/push_status")
            return next((p for p in status["pushes"]
                         if "AuthorizationPolicy/shop/deny-admin" in p["config_keys"]), None)

        push = await wait_for(pushed, message="a new AuthorizationPolicy causes a push")
        assert push["full"] is True and push["reasons"] == {"config": 1}
