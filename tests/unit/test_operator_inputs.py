"""Pure parts of the operator surface: flag checks, log level parsing, istiod's syncz states."""

from __future__ import annotations

import argparse
import json
import logging

import pytest
from envoy.service.status.v3 import csds_pb2

from pilot import logging as plog
from pilot.cli import _address, build_parser
from pilot.xds.connection import Connection, Nack, WatchedResource
from pilot.xds.generators import debug
from tests.unit.helpers import proxy

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
LDS = "type.googleapis.com/envoy.config.listener.v3.Listener"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
RDS = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"


@pytest.mark.parametrize(
    "good",
    [
        "",
        ":15010",
        "0.0.0.0:0",
        "127.0.0.1:65535",
        "[::1]:15012",
        "[::]:8080",
        "localhost:15014",
        "istiod.istio-system.svc:15012",
    ],
)
def test_addresses_accepted(good):
    assert _address(good) == good


@pytest.mark.parametrize(
    "bad",
    [
        "15010",
        "127.0.0.1:99999",
        "127.0.0.1:-1",
        "127.0.0.1:",
        "host:http",
        "[::1:15012",
        "bad host:1",
        "a_b:1",
    ],
)
def test_addresses_refused(bad):
    with pytest.raises(argparse.ArgumentTypeError):
        _address(bad)


def test_log_levels_per_scope():
    assert plog.parse_levels("ads:debug,default:info") == plog.Levels(logging.INFO, {"ads": logging.DEBUG})
    assert plog.parse_levels("warn") == plog.Levels(logging.WARNING, {})
    assert plog.parse_levels("all:error,cache:none").scopes == {"cache": logging.CRITICAL + 10}
    assert plog.parse_levels("ads:debug,default:warn").lowest() == logging.DEBUG
    for bad in ("default:loud", "ads:", "a b:debug"):
        with pytest.raises(ValueError):
            plog.parse_levels(bad)


def test_parser_refuses_bad_levels():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["discovery", "--log_output_level", "ads:verbose"])


def test_syncz_states_follow_nonces_and_nacks():
    conn = Connection(proxy(), "", False)
    conn.watched[LDS] = WatchedResource(LDS)  # subscribed, nothing sent yet
    conn.watched[CDS] = WatchedResource(CDS, nonce_sent="n2", nonce_acked="n1", last_sent_at=1.5)
    conn.watched[RDS] = WatchedResource(RDS, nonce_sent="n3", nonce_acked="n3", version_acked="v3")
    nacked = conn.watched[EDS] = WatchedResource(EDS, nonce_sent="n4", nonce_acked="n1")
    nacked.last_nack = Nack("v1", "n4", "bad endpoint", 13, 2.0, (), ())
    cc = debug.client_config(conn)
    by_type = {x.type_url: x for x in cc.generic_xds_configs}
    assert [x.type_url for x in cc.generic_xds_configs] == sorted(by_type)
    assert by_type[LDS].config_status == csds_pb2.NOT_SENT
    assert (
        by_type[CDS].config_status == csds_pb2.STALE
        and by_type[CDS].last_updated.ToNanoseconds() == 1_500_000_000
    )
    assert by_type[RDS].config_status == csds_pb2.SYNCED and by_type[RDS].version_info == "v3"
    assert by_type[EDS].config_status == csds_pb2.ERROR and by_type[EDS].error_state.details == "bad endpoint"
    nacked.last_nack.cleared = True  # a later ACK ends the rejection
    assert {x.type_url: x.config_status for x in debug.client_config(conn).generic_xds_configs}[
        EDS
    ] == csds_pb2.STALE
    assert cc.node.id == conn.proxy.id and cc.node.metadata.fields["NAMESPACE"].string_value == "default"


def test_debug_clients_are_not_proxies():
    tool = Connection(proxy(generator="event"), "", False)
    assert debug.is_debug_client(tool)
    assert not debug.is_debug_client(Connection(proxy(), "", False))
    assert (
        debug.is_debug("istio.io/debug")
        and debug.is_debug(debug.SYNCZ)
        and not debug.is_debug("istio.io/debugz")
    )


def test_version_command_prints_istiods_shapes(capsys):
    from pilot.cli import main
    from pilot.version import build_info

    assert main(["version", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"clientVersion": build_info()}
    assert main(["version", "--short"]) == 0
    assert capsys.readouterr().out == f"client version: {build_info()['version']}\n"
    assert main(["version"]) == 0
    assert capsys.readouterr().out.startswith('client version: version.BuildInfo{Version:"')
