"""Security policies in the running control plane (file mode): accepted, rejected with the reason,
listed as unsupported where they cannot be applied as written, and a change is a full push."""

from __future__ import annotations

import pytest
import yaml

from tests.support.control_plane import ControlPlane
from tests.support.policies import authz, peer_authn, request_authn
from tests.support.wait import wait_for
from tests.unit.test_jwks_resolver import IssuerServer

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
        # The fail-closed CUSTOM policy says why in /debug/push_status and the log too.
        status = await cp.debug("/debug/push_status")
        [custom] = [p for p in status["policyProblems"] if p["name"] == "ext"]
        assert "available providers are [] but found 'opa'" in custom["reason"]
        assert any("policy not applied as written" in line and "'opa'" in line
                   for line in cp.log_tail(400).splitlines())

        cp.write("more.yaml", dump(authz("deny-admin", "shop", action="DENY",
                                         rules=[{"to": [{"operation": {"paths": ["/admin"]}}]}])))

        async def pushed() -> dict | None:
            status = await cp.debug("/debug/push_status")
            return next((p for p in status["pushes"]
                         if "AuthorizationPolicy/shop/deny-admin" in p["config_keys"]), None)

        push = await wait_for(pushed, message="a new AuthorizationPolicy causes a push")
        assert push["full"] is True and "config" in push["reasons"]


async def test_jwks_uri_keys_are_fetched_and_pushed(tmp_path):
    issuer = await IssuerServer().start()
    issuer.status = 503  # down at first: the policy is reported, then fetched on retry
    cp = ControlPlane(tmp_path)
    cp.write("jwt.yaml", dump(request_authn("jwt", "shop", jwtRules=[{"issuer": issuer.base,
                                                                      "jwksUri": f"{issuer.base}/jwks"}])))
    try:
        async with cp:
            async def reported() -> bool:
                configz = await cp.debug("/debug/configz")
                return any("HTTP 503" in u["reason"] for u in configz["unsupported"])

            await wait_for(reported, message="the failing jwksUri shows in /debug/configz")
            issuer.status = 200

            async def fetched() -> bool:
                return (await cp.debug("/debug/configz"))["unsupported"] == []

            await wait_for(fetched, timeout=15, message="keys fetched on retry")
            pushes = (await cp.debug("/debug/push_status"))["pushes"]
            assert any("JWKS/keys" in p["config_keys"] and p["full"] for p in pushes)
    finally:
        await issuer.stop()
