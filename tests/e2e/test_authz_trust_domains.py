"""AuthorizationPolicy trust domains with real Envoys and real certificates from our CA: the peer
certificate's SPIFFE trust domain (cluster.local here) must match, alongside every other
attribute of the same source. The user's report: `{namespaces: [default], trustDomains:
[other.domain]}` was stored as `{namespaces: [default]}` and let the caller in."""

from __future__ import annotations

import pytest

from tests.e2e.mtls_mesh import MtlsMesh
from tests.e2e.test_mtls import policy

pytestmark = pytest.mark.timeout(120)


async def test_trust_domains_narrow_a_source_and_the_when_key_matches_the_peer(tmp_path):
    async with MtlsMesh(tmp_path) as mesh:
        async def status_is(code: int):
            async def check():
                return (await mesh.call())[0] == code
            return check

        await mesh.until(await status_is(200), "mTLS traffic")

        # Namespace right, trust domain wrong: denied (an ALLOW policy that matches nothing).
        mesh.cp.write("authz.yaml", policy("AuthorizationPolicy", "reviews", """\
            selector: {matchLabels: {app: reviews}}
            rules: [{from: [{source: {namespaces: [default], trustDomains: [other.domain]}}]}]
            """))
        await mesh.until(await status_is(403), "a foreign trust domain is not the caller's")

        # Both right (a suffix wildcard, kept inside the trust domain): allowed.
        mesh.cp.write("authz.yaml", policy("AuthorizationPolicy", "reviews", """\
            selector: {matchLabels: {app: reviews}}
            rules: [{from: [{source: {namespaces: [default], trustDomains: ["*.local"]}}]}]
            """))
        await mesh.until(await status_is(200), "the caller's trust domain matches")

        # `source.trustDomain` in `when`, on a DENY policy: the caller's trust domain is denied.
        mesh.cp.write("deny.yaml", policy("AuthorizationPolicy", "deny-local", """\
            selector: {matchLabels: {app: reviews}}
            action: DENY
            rules: [{when: [{key: source.trustDomain, values: [cluster.local]}]}]
            """))
        await mesh.until(await status_is(403), "DENY by source.trustDomain")
        mesh.cp.write("deny.yaml", policy("AuthorizationPolicy", "deny-local", """\
            selector: {matchLabels: {app: reviews}}
            action: DENY
            rules: [{when: [{key: source.trustDomain, notValues: [cluster.local]}]}]
            """))
        await mesh.until(await status_is(200), "notValues spare the caller's trust domain")

        # A misspelt field is refused with its path (never read as a wider policy).
        mesh.cp.write("authz.yaml", policy("AuthorizationPolicy", "reviews", """\
            selector: {matchLabels: {app: reviews}}
            rules: [{from: [{source: {namespaces: [default], trustDomain: [other.domain]}}]}]
            """))

        async def refused():
            configz = await mesh.cp.debug("/debug/configz")
            rejected = configz.get("rejected") if isinstance(configz, dict) else None
            return [r for r in rejected or () if r["name"] == "reviews"
                    and "spec.rules[0].from[0].source.trustDomain: unknown field" in r["reason"]]
        await mesh.until(refused, "the unknown field is reported in /debug/configz")
        assert (await mesh.call())[0] == 200
