"""EnvoyFilter `applyTo: BOOTSTRAP`: validation (MERGE only, no `node`, Envoy's field names), the
BDS generator merging a proxy's patches into the bootstrap its agent sent (context and proxy
match, shared bytes), and the agent's side: the round trip of its bootstrap through the request
node, Envoy's own verdict on a patched one, and fetch() against a real gRPC server answering
with a good, a bad or no bootstrap (ACK, NACK with Envoy's reason, fallback to its own)."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2, json_format

from pilot.agent import bootstrap_xds
from pilot.agent import config as agent_config
from pilot.agent.bootstrap import envoy_bootstrap, node_metadata
from pilot.agent.config import find_envoy
from pilot.config.validation import parse_object
from pilot.model.proxy import Proxy, proxy_from_node
from pilot.model.store import ConfigKey
from pilot.xds.cache import XdsCache
from pilot.xds.generators import bootstrap as bds
from pilot.xds.typeurls import AGENT_BOOTSTRAP_METADATA, BOOTSTRAP
from tests.support.ports import free_port
from tests.support.wait import wait_for

from .helpers import World
from .test_envoy_filter import envoy_filter

ENVOY = find_envoy()


def agent_base(ptype: str = "sidecar", pod: str = "app-1", labels: dict | None = None) -> dict:
    """The bootstrap the real agent code writes for a workload of namespace `default`."""
    env = {"INSTANCE_IP": "10.0.0.1", "POD_NAME": pod, "POD_NAMESPACE": "default",
           "ISTIO_METAJSON_LABELS": json.dumps(labels or {"app": "a"})}
    cfg, _ = agent_config.load(proxy_type=ptype, env=env, overrides={}, find_envoy=lambda _: ENVOY,
                               read_file=lambda _: "")
    md, _ = node_metadata(cfg)
    return envoy_bootstrap(cfg, md)


def bootstrap_proxy(base: dict) -> Proxy:
    """The proxy the control plane makes of the agent's bootstrap request (its node, as sent)."""
    return proxy_from_node(bootstrap_xds.request_node(base))


def served(world: World, p: Proxy, cache: XdsCache | None = None) -> bootstrap_pb2.Bootstrap | None:
    out = bds.generate(world.ctx(), p, None, cache or world.cache)
    if not out:
        return None
    (res,) = out
    return res.message(bootstrap_pb2.Bootstrap)


def stats_tag(tag: str = "x_tag", regex: str = r"^cluster\.((.+?)\.)") -> dict:
    return {"applyTo": "BOOTSTRAP", "patch": {"operation": "MERGE", "value": {
        "stats_config": {"stats_tags": [{"tag_name": tag, "regex": regex}]}}}}


def runtime_layer(key: str = "bds.test", value: str = "on", context: str | None = None) -> dict:
    patch: dict = {"applyTo": "BOOTSTRAP", "patch": {"operation": "MERGE", "value": {
        "layered_runtime": {"layers": [{"name": "bds", "static_layer": {key: value}}]}}}}
    if context:
        patch["match"] = {"context": context}
    return patch


# --- validation ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("patch", "reason"), [
    ({"applyTo": "BOOTSTRAP", "patch": {"operation": "ADD", "value": {}}}, "BOOTSTRAP supports MERGE only, not ADD"),
    ({"applyTo": "BOOTSTRAP", "patch": {"operation": "REMOVE"}}, "BOOTSTRAP supports MERGE only, not REMOVE"),
    ({"applyTo": "BOOTSTRAP", "patch": {"operation": "MERGE", "value": {"node": {"id": "sidecar~1.2.3.4~x.y~y.svc"}}}},
     "cannot change `node`"),
    ({"applyTo": "BOOTSTRAP", "patch": {"operation": "MERGE", "value": {"stats_config": {"no_such_field": 1}}}},
     'no field named "no_such_field"'),
    ({"applyTo": "BOOTSTRAP", "match": {"listener": {"portNumber": 80}},
      "patch": {"operation": "MERGE", "value": {}}}, "only a proxy match"),
])
def test_bad_bootstrap_patches_are_refused_with_path_and_reason(patch, reason):
    with pytest.raises(Exception) as err:
        parse_object(envoy_filter("bad", [patch]))
    assert reason in str(err.value) and "configPatches" in str(err.value), str(err.value)


def test_a_bootstrap_merge_is_accepted_as_the_bootstrap_message():
    obj = parse_object(envoy_filter("ok", [stats_tag()]))
    msg = obj.spec.config_patches[0].message
    assert isinstance(msg, bootstrap_pb2.Bootstrap) and msg.stats_config.stats_tags[0].tag_name == "x_tag"


# --- the generator ------------------------------------------------------------------------------
def test_patches_are_merged_into_the_agents_own_bootstrap():
    world = World()
    base = agent_base()
    p = bootstrap_proxy(base)
    unpatched = served(world, p)
    assert unpatched is not None
    assert bootstrap_xds.to_json_dict(unpatched) == bootstrap_xds.to_json_dict(json_format.ParseDict(
        base, bootstrap_pb2.Bootstrap()))  # no patch: the agent's bootstrap, as sent
    world.apply(envoy_filter("tags", [stats_tag(), runtime_layer(),
                                      {"applyTo": "BOOTSTRAP", "patch": {"operation": "MERGE", "value": {
                                          "stats_flush_interval": "7s"}}}]))
    got = served(world, p)
    assert got is not None
    assert [t.tag_name for t in got.stats_config.stats_tags] == ["x_tag"]
    # Repeated fields append (istio's merge): the agent's admin layer stays, the patch's follows.
    assert [layer.name for layer in got.layered_runtime.layers] == ["admin", "bds"]
    assert got.layered_runtime.layers[1].static_layer["bds.test"] == "on"
    assert got.stats_flush_interval.seconds == 7
    # What the agent relies on is intact.
    assert got.node.id == base["node"]["id"]
    assert {c.name for c in got.static_resources.clusters} == {"sds-grpc", "xds-grpc"}
    assert got.admin.address.socket_address.port_value == 15000


def test_a_duration_is_replaced_not_merged_field_by_field():
    world = World()
    base = agent_base()
    base["stats_flush_interval"] = "0.5s"
    world.apply(envoy_filter("flush", [{"applyTo": "BOOTSTRAP", "patch": {"operation": "MERGE", "value": {
        "stats_flush_interval": "5s"}}}]))
    got = served(world, bootstrap_proxy(base))
    assert got is not None
    assert (got.stats_flush_interval.seconds, got.stats_flush_interval.nanos) == (5, 0)  # not 5.5 s


def test_context_selector_and_proxy_match_decide_who_gets_a_patch():
    world = World()
    world.apply(envoy_filter("gw", [runtime_layer("gw.only", context="GATEWAY")]),
                envoy_filter("sc", [runtime_layer("sidecar.only", context="SIDECAR_OUTBOUND")]),
                envoy_filter("sel", [runtime_layer("app.b")], selector={"app": "b"}),
                envoy_filter("ver", [{**runtime_layer("v.never"), "match": {"proxy": {"proxyVersion": "^0\\.1$"}}}]))

    def keys(base: dict) -> set[str]:
        got = served(world, bootstrap_proxy(base))
        assert got is not None
        return {k for layer in got.layered_runtime.layers for k in layer.static_layer}

    assert keys(agent_base()) == {"sidecar.only"}
    assert keys(agent_base(labels={"app": "b"}, pod="b-1")) == {"sidecar.only", "app.b"}
    assert keys(agent_base("router", pod="gw-1")) == {"gw.only"}


def test_the_patched_bootstrap_names_its_envoy_filters_and_is_shared_by_equal_inputs():
    world = World()
    world.apply(envoy_filter("tags", [stats_tag()]))
    base = agent_base()
    ctx = world.ctx()
    (one,) = bds.generate(ctx, bootstrap_proxy(base), None, world.cache)
    (two,) = bds.generate(ctx, bootstrap_proxy(base), None, world.cache)
    assert one is two and one.origins == ("EnvoyFilter/default/tags",) and one.name == bds.NAME
    other = agent_base(pod="app-2")
    (three,) = bds.generate(ctx, bootstrap_proxy(other), None, world.cache)
    assert three.message(bootstrap_pb2.Bootstrap).node.id == other["node"]["id"] != base["node"]["id"]


def test_a_request_without_the_agents_bootstrap_gets_no_resource():
    world = World()
    world.apply(envoy_filter("tags", [stats_tag()]))
    base = agent_base()
    node = bootstrap_xds.request_node(base)
    del node.metadata.fields[AGENT_BOOTSTRAP_METADATA]
    assert served(world, proxy_from_node(node)) is None


# --- the agent ----------------------------------------------------------------------------------
async def test_envoy_itself_judges_a_patched_bootstrap(tmp_path):
    good = agent_base()
    assert await bootstrap_xds.validate(ENVOY, good, str(tmp_path)) is None
    bad = json.loads(json.dumps(good))
    bad["stats_config"] = {"stats_tags": [{"tag_name": "x", "regex": "(unclosed"}]}
    why = await bootstrap_xds.validate(ENVOY, bad, str(tmp_path))
    assert why is not None and "(unclosed" in why, why
    assert list(tmp_path.iterdir()) == []  # its files go


class BootstrapServer:
    """A real gRPC ADS server answering bootstrap requests with `answer(request) -> resources`,
    recording what the agent says back (ACK or NACK)."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.requests: list[discovery_pb2.DiscoveryRequest] = []
        self.server = grpc.aio.server()
        self.port = 0

    async def _stream(self, requests, context):
        async for req in requests:
            self.requests.append(req)
            if not req.response_nonce:
                resources = self.answer(req)
                yield discovery_pb2.DiscoveryResponse(type_url=BOOTSTRAP, version_info="v1", nonce="n1",
                                                      resources=resources)

    async def __aenter__(self):
        self.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "envoy.service.discovery.v3.AggregatedDiscoveryService",
            {"StreamAggregatedResources": grpc.stream_stream_rpc_method_handler(
                self._stream, request_deserializer=discovery_pb2.DiscoveryRequest.FromString,
                response_serializer=discovery_pb2.DiscoveryResponse.SerializeToString)})])
        self.port = self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        await self.server.start()
        return self

    async def __aexit__(self, *_):
        await self.server.stop(None)

    def channel(self) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")

    def answers(self) -> list[discovery_pb2.DiscoveryRequest]:
        return [r for r in self.requests if r.response_nonce]


def patched_any(req: discovery_pb2.DiscoveryRequest, extra: dict) -> list[any_pb2.Any]:
    """What a control plane makes of the request: the bootstrap in its node metadata, plus `extra`."""
    base = json_format.MessageToDict(req.node.metadata)[AGENT_BOOTSTRAP_METADATA]
    bs = json_format.ParseDict({**base, **extra}, bootstrap_pb2.Bootstrap())
    out = any_pb2.Any()
    out.Pack(bs)
    return [out]


async def test_fetch_acks_a_good_bootstrap_and_starts_envoy_with_it(tmp_path):
    base = agent_base()
    async with BootstrapServer(lambda r: patched_any(r, {"stats_flush_interval": "9s"})) as srv:
        outcome = await asyncio.wait_for(bootstrap_xds.fetch(srv.channel, base, ENVOY, str(tmp_path)), 60)
        assert outcome.patched and outcome.bootstrap["stats_flush_interval"] == "9s"
        assert outcome.bootstrap["node"]["id"] == base["node"]["id"]
        (ack,) = srv.answers()
        assert ack.version_info == "v1" and not ack.HasField("error_detail")
    # The request's node is the bootstrap's, carrying the bootstrap itself.
    first = srv.requests[0]
    assert first.type_url == BOOTSTRAP and first.node.id == base["node"]["id"]


async def test_fetch_nacks_a_bootstrap_envoy_refuses_and_keeps_the_agents_own(tmp_path):
    base = agent_base()
    bad = {"stats_config": {"stats_tags": [{"tag_name": "x", "regex": "(unclosed"}]}}
    async with BootstrapServer(lambda r: patched_any(r, bad)) as srv:
        outcome = await asyncio.wait_for(bootstrap_xds.fetch(srv.channel, base, ENVOY, str(tmp_path)), 60)
        assert not outcome.patched and outcome.bootstrap == base
        assert "(unclosed" in outcome.reason
        (nack,) = srv.answers()
        assert nack.error_detail.message.startswith("bootstrap: Envoy refuses it:")
        assert "(unclosed" in nack.error_detail.message


async def test_fetch_without_a_bootstrap_in_the_answer_keeps_the_agents_own(tmp_path):
    base = agent_base()
    async with BootstrapServer(lambda r: []) as srv:
        outcome = await asyncio.wait_for(bootstrap_xds.fetch(srv.channel, base, ENVOY, str(tmp_path)), 60)
    assert not outcome.patched and outcome.bootstrap == base and "no bootstrap" in outcome.reason


async def test_an_unpatched_answer_is_acked_and_the_agents_own_bootstrap_kept(tmp_path):
    base = agent_base()
    async with BootstrapServer(lambda r: patched_any(r, {})) as srv:
        outcome = await asyncio.wait_for(bootstrap_xds.fetch(srv.channel, base, ENVOY, str(tmp_path)), 60)
        assert (outcome.patched, outcome.bootstrap, outcome.reason) == (False, base, "")
        (ack,) = srv.answers()
        assert not ack.HasField("error_detail")


async def test_fetch_retries_until_the_control_plane_answers(tmp_path, monkeypatch):
    monkeypatch.setattr(bootstrap_xds, "BACKOFF_FIRST", 0.05)
    base = agent_base()
    srv = BootstrapServer(lambda r: patched_any(r, {"stats_flush_interval": "3s"}))
    srv.port = free_port()  # where it will listen
    attempts: list[int] = []

    def channel() -> grpc.aio.Channel:
        attempts.append(1)
        return srv.channel()

    fetch = asyncio.ensure_future(bootstrap_xds.fetch(channel, base, ENVOY, str(tmp_path)))
    await wait_for(lambda: len(attempts) >= 2, timeout=30, message="a failed attempt retried")
    assert not fetch.done()
    async with srv:
        outcome = await asyncio.wait_for(fetch, 60)
    assert outcome.patched


def test_an_envoy_whose_bootstrap_lacks_its_patches_is_told_apart():
    world = World()
    base = agent_base()
    plain = proxy_from_node(bootstrap_xds.request_node(base))  # Envoy started from the agent's own
    assert bds.not_in_effect(world.ctx(), plain) is None  # no patches, none held: nothing to say
    world.apply(envoy_filter("tags", [stats_tag()]))
    row = bds.not_in_effect(world.ctx(), plain)
    assert row is not None and row["envoyFilters"] == ["EnvoyFilter/default/tags"] and row["inEnvoysBootstrap"] == []
    # Envoy started from the patched bootstrap: its node says which patches it holds.
    got = served(world, bootstrap_proxy(base))
    assert got is not None
    envoy = proxy_from_node(got.node)
    assert bds.not_in_effect(world.ctx(), envoy) is None
    # The EnvoyFilter changes: the running bootstrap holds the old patch until the agent restarts.
    world.apply(envoy_filter("tags", [stats_tag("y_tag")]))
    row = bds.not_in_effect(world.ctx(), envoy)
    assert row is not None and row["inEnvoysBootstrap"] == ["EnvoyFilter/default/tags"]
    world.store.delete(ConfigKey("EnvoyFilter", "default", "tags"))
    row = bds.not_in_effect(world.ctx(), envoy)
    assert row is not None and row["envoyFilters"] == []


@pytest.mark.parametrize(("env", "expected"), [
    ({}, False),  # istio-agent's default
    ({"BOOTSTRAP_XDS_AGENT": "true"}, True),
    ({"PROXY_CONFIG": json.dumps({"proxyMetadata": {"BOOTSTRAP_XDS_AGENT": "true"}})}, True),
])
def test_the_setting_is_off_by_default_and_read_from_the_environment_or_proxy_metadata(env, expected):
    cfg, _ = agent_config.load(proxy_type="sidecar", env={"INSTANCE_IP": "10.0.0.1", **env}, overrides={},
                               find_envoy=lambda _: ENVOY, read_file=lambda _: "")
    assert cfg.bootstrap_xds is expected
