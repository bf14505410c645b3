"""EnvoyFilter `applyTo: BOOTSTRAP` with the real pilot-agent and Envoy: with BOOTSTRAP_XDS_AGENT
the agent fetches its bootstrap over xDS before starting Envoy, and the patches (a static runtime
layer, a stats tag) are in Envoy's own /runtime and /config_dump; without it (the default) they
are not. A patch Envoy refuses (a stats tag regex that does not compile) leaves Envoy started with
the agent's own bootstrap, and the control plane reports the EnvoyFilter with Envoy's reason;
/debug/push_status lists the Envoys whose bootstrap lacks their BOOTSTRAP patches."""

from __future__ import annotations

import textwrap

import pytest

from tests.e2e.test_pilot_agent import NAMESPACE, NODE_ID, agent, plane
from tests.support.control_plane import ControlPlane
from tests.support.wait import wait_for
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(240)  # four agents, one after another


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    return Issuer("ES256")


def bootstrap_filter(name: str, key: str, tag_regex: str) -> str:
    return textwrap.dedent(f"""\
        apiVersion: networking.istio.io/v1alpha3
        kind: EnvoyFilter
        metadata: {{name: {name}, namespace: {NAMESPACE}}}
        spec:
          workloadSelector: {{labels: {{app: cart}}}}
          configPatches:
          - applyTo: BOOTSTRAP
            patch:
              operation: MERGE
              value:
                layered_runtime:
                  layers:
                  - name: {name}
                    static_layer: {{{key}: enabled}}
                stats_config:
                  stats_tags:
                  - tag_name: {name}_tag
                    regex: '{tag_regex}'
        """)


async def in_force(cp: ControlPlane, name: str, before: str) -> None:
    """The control plane holds the object and has built a push context since `before`."""

    async def loaded() -> bool:
        configz = await cp.debug("/debug/configz")
        held = any(c["kind"] == "EnvoyFilter" and c["name"] == name for c in configz["configs"])
        return held and await cp.push_version() != before

    await wait_for(loaded, 20, message=f"{name} loaded\n{cp.log_tail(10)}")


async def not_in_effect(cp: ControlPlane) -> list[dict]:
    """/debug/push_status rows of this test's connected Envoy whose bootstrap lacks its patches."""
    return [r for r in (await cp.debug("/debug/push_status"))["bootstrapPatchesNotInEffect"] if r["proxy"] == NODE_ID]


async def only_this_envoy(cp: ControlPlane) -> None:
    """The previous agent's Envoy (same node id) is gone and this one synced: what the control
    plane then says of NODE_ID is about this Envoy."""

    async def one() -> bool:
        return [r["proxy"] for r in await cp.debug("/debug/syncz")].count(NODE_ID) == 1

    await wait_for(one, 20, message="one connection of the node")
    await cp.wait_synced(NODE_ID, types=("cluster", "listener"), timeout=30)


async def runtime_entries(a) -> dict:
    return (await a.admin_json("/runtime"))["entries"]


async def bootstrap_of(a) -> dict:
    dump = await a.admin_json("/config_dump")
    (boot,) = [c for c in dump["configs"] if c["@type"].endswith(".BootstrapConfigDump")]
    return boot["bootstrap"]


async def test_bootstrap_patches_reach_envoy_through_the_agent_and_bad_ones_are_reported(tmp_path, issuer):
    async with plane(tmp_path, issuer) as cp:
        before = await cp.push_version()
        cp.write("bds.yaml", bootstrap_filter("bds", "bds.e2e", r"^cluster\.((.+?)\.)"))
        await in_force(cp, "bds", before)

        # 1. BOOTSTRAP_XDS_AGENT=true: Envoy runs the patched bootstrap.
        async with agent(tmp_path, cp, issuer, env={"BOOTSTRAP_XDS_AGENT": "true"}) as a:
            await a.wait_ready()
            entries = await runtime_entries(a)
            assert entries.get("bds.e2e", {}).get("final_value") == "enabled", entries
            bootstrap = await bootstrap_of(a)
            tags = [t["tag_name"] for t in bootstrap.get("stats_config", {}).get("stats_tags", [])]
            assert "bds_tag" in tags, bootstrap.get("stats_config")
            assert bootstrap["node"]["id"] == NODE_ID  # the agent's identity, untouched
            assert [layer["name"] for layer in bootstrap["layered_runtime"]["layers"]] == ["admin", "bds"]
            assert "bootstrap from the control plane" in a.log_text()
            metrics = await cp.metrics()
            assert f'pilot_envoy_filter_status{{name="{NAMESPACE}/bds",type="bootstrap"}} 1.0' in metrics
            await only_this_envoy(cp)
            assert await not_in_effect(cp) == []  # Envoy's node says its bootstrap holds them

        # 2. The default (istiod's too): the agent writes its own bootstrap, no patch in Envoy.
        async with agent(tmp_path, cp, issuer, name="plain") as a:
            await a.wait_ready()
            assert "bds.e2e" not in await runtime_entries(a)
            assert "bootstrap from the control plane" not in a.log_text()
            # The control plane tells this Envoy apart: its patches are not in its bootstrap.
            rows = await wait_for(lambda: not_in_effect(cp), 20, message="reported not in effect")
            assert rows[0]["envoyFilters"] == [f"EnvoyFilter/{NAMESPACE}/bds"] and rows[0]["inEnvoysBootstrap"] == []

        # 3. A patch Envoy refuses: Envoy starts with the agent's own bootstrap, the control plane
        #    is told (a NACK with Envoy's reason) and reports the EnvoyFilter.
        before = await cp.push_version()
        cp.write("broken.yaml", bootstrap_filter("broken", "broken.e2e", "(unclosed"))
        await in_force(cp, "broken", before)
        async with agent(tmp_path, cp, issuer, env={"BOOTSTRAP_XDS_AGENT": "true"}, name="broken") as a:
            await a.wait_ready()
            entries = await runtime_entries(a)
            assert "broken.e2e" not in entries and "bds.e2e" not in entries, entries
            log = a.log_text()
            assert "starting Envoy with the agent's own bootstrap" in log and "(unclosed" in log, a.log_tail()

            async def reported():
                status = await cp.debug("/debug/push_status")
                rows = [r for r in status["envoyFilterRejections"]
                        if r["envoyFilter"] == f"EnvoyFilter/{NAMESPACE}/broken"]
                return rows or None

            rows = await wait_for(reported, 20, message=f"rejection reported\n{cp.log_tail(20)}")
            assert rows[0]["type"] == "bds" and "(unclosed" in rows[0]["error"], rows
            # Its config over ADS is unaffected; the good patch is reported as not in its bootstrap.
            await only_this_envoy(cp)
            rows = await wait_for(lambda: not_in_effect(cp), 20, message="reported not in effect")
            assert rows[0]["envoyFilters"] == [f"EnvoyFilter/{NAMESPACE}/bds"], rows

        # 4. The next start goes without the rejected EnvoyFilter, with the good one.
        async with agent(tmp_path, cp, issuer, env={"BOOTSTRAP_XDS_AGENT": "true"}, name="again") as a:
            await a.wait_ready()
            entries = await runtime_entries(a)
            assert entries.get("bds.e2e", {}).get("final_value") == "enabled" and "broken.e2e" not in entries
            await only_this_envoy(cp)
            assert await not_in_effect(cp) == []
