"""MeshConfig fields that are not applied, and PILOT_* variables no knob reads: tolerated, as
istiod tolerates them, but never silent (one warning, listed in /debug/mesh)."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from pilot.config.core import ConfigMap
from pilot.config.mesh import MeshConfigError, parse_mesh_config
from pilot.features import Features
from pilot.model.mesh import MeshHolder
from pilot.model.store import Store

MESH = """\
trustDomain: td.example
extensionProviders: [{name: authz, envoyExtAuthzGrpc: {service: authz.svc, port: 9000}}]
defaultProviders: {tracing: [zipkin]}
accessLogFormat: "[%START_TIME%]"
accessLogEncoding: JSON
enableEnvoyAccessLogService: true
disableEnvoyListenerLog: true
localityLbSetting: {enabled: true}
trustDomainAliases: [old.td]
caCertificates: [{pem: x}]
meshMTLS: {minProtocolVersion: TLSV1_3}
outboundTrafficPolicy: {mode: REGISTRY_ONLY, egressProxy: {host: egress}}
defaultHttpRetryPolicy: {attempts: 3, retryRemoteLocalities: true}
discoverySelectors: [{matchLabels: {team: a}}]
notAMeshField: 1
"""


def test_unsupported_fields_are_listed_and_everything_else_still_applies() -> None:
    m = parse_mesh_config(MESH)
    assert m.unsupported == (
        "caCertificates", "defaultHttpRetryPolicy.retryRemoteLocalities", "disableEnvoyListenerLog",
        "enableEnvoyAccessLogService", "meshMTLS", "notAMeshField",
        "outboundTrafficPolicy.egressProxy")
    # the telemetry fields are applied, and the ext_authz provider (for AuthorizationPolicy CUSTOM)
    assert m.access_log_encoding == "JSON" and m.default_providers.tracing == ["zipkin"]
    assert m.providers["authz"].provider_kind == "envoy_ext_authz_grpc"
    # applied fields stay applied next to ignored ones
    assert m.trust_domain == "td.example" and m.outbound_traffic_policy.mode == "REGISTRY_ONLY"
    assert m.default_http_retry_policy.attempts == 3
    assert m.locality_lb_setting is not None and m.locality_lb_setting.enabled is True
    assert m.discovery_selectors[0].match_labels == {"team": "a"}
    assert m.trust_domains == ("td.example", "old.td")
    assert m.extension_providers[0].envoy_ext_authz_grpc.port == 9000  # an ext_authz kind: applied
    assert parse_mesh_config("trustDomain: td.example").unsupported == ()


def test_a_bad_value_still_rejects_the_mesh_config_naming_only_the_bad_field() -> None:
    with pytest.raises(MeshConfigError) as e:
        parse_mesh_config("enableEnvoyAccessLogService: true\nconnectTimeout: 0s\n")
    assert "connectTimeout must be positive" in str(e.value) and "enableEnvoyAccessLogService" not in str(e.value)


def configmap(mesh: str, **extra: str) -> ConfigMap:
    return ConfigMap.model_validate({"apiVersion": "v1", "kind": "ConfigMap",
                                     "metadata": {"name": "istio", "namespace": "istio-system"},
                                     "data": {"mesh": mesh, **extra}})


def test_the_holder_warns_once_per_change_of_what_is_ignored() -> None:
    store = Store()
    with capture_logs() as logs:
        holder = MeshHolder(parse_mesh_config("enableEnvoyAccessLogService: true\n"), "istio-system")
        holder.refresh(store)  # same file mesh: no second warning
        store.apply(configmap("enableEnvoyAccessLogService: true\ndisableEnvoyListenerLog: true\n",
                              meshNetworks="networks: {}"))
        holder.refresh(store)
        holder.refresh(store)
        store.apply(configmap("trustDomain: x\n"))
        holder.refresh(store)
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [w["fields"] for w in warnings] == [["enableEnvoyAccessLogService"],
                                               ["disableEnvoyListenerLog", "enableEnvoyAccessLogService"]]
    assert holder.unsupported == () and holder.current.trust_domain == "x"


def test_unknown_pilot_variables_are_reported_known_ones_and_others_are_not() -> None:
    f = Features.from_env({"PILOT_DEBOUNCE_AFTER": "1s", "PILOT_ENABLE_CDS_CACHE": "false",
                           "PILOT_ENABLE_WORKLOAD_ENTRY_AUTOREGISTRATION": "true", "HOME": "/root"})
    assert f.unknown_env == ("PILOT_ENABLE_CDS_CACHE",)
    assert f.debounce_after == 1.0
