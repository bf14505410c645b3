"""Every apiVersion istio 1.30 and Gateway API v1.5/v1.6 serve for the kinds modelled is accepted
(from the upstream CRDs: istio manifests/charts/base/files/crd-all.gen.yaml; gateway-api
config/crd/{standard,experimental}); anything else is refused naming the versions served."""

from __future__ import annotations

import pytest

from pilot.config.kinds import lookup
from pilot.config.validation import InvalidObject, parse_object

SERVED = {
    ("networking.istio.io", "VirtualService"): ("v1", "v1beta1", "v1alpha3"),
    ("networking.istio.io", "DestinationRule"): ("v1", "v1beta1", "v1alpha3"),
    ("networking.istio.io", "ServiceEntry"): ("v1", "v1beta1", "v1alpha3"),
    ("networking.istio.io", "WorkloadEntry"): ("v1", "v1beta1", "v1alpha3"),
    ("networking.istio.io", "Sidecar"): ("v1", "v1beta1", "v1alpha3"),
    ("networking.istio.io", "Gateway"): ("v1", "v1beta1", "v1alpha3"),
    ("security.istio.io", "AuthorizationPolicy"): ("v1", "v1beta1"),
    ("security.istio.io", "PeerAuthentication"): ("v1", "v1beta1"),
    ("security.istio.io", "RequestAuthentication"): ("v1", "v1beta1"),
    ("gateway.networking.k8s.io", "GatewayClass"): ("v1", "v1beta1"),
    ("gateway.networking.k8s.io", "Gateway"): ("v1", "v1beta1"),
    ("gateway.networking.k8s.io", "HTTPRoute"): ("v1", "v1beta1"),
    ("gateway.networking.k8s.io", "GRPCRoute"): ("v1",),
    ("gateway.networking.k8s.io", "TCPRoute"): ("v1", "v1alpha2"),
    ("gateway.networking.k8s.io", "TLSRoute"): ("v1", "v1alpha2", "v1alpha3"),
    ("gateway.networking.k8s.io", "ReferenceGrant"): ("v1", "v1beta1"),
}


@pytest.mark.parametrize(("group", "kind", "version"),
                         [(g, k, v) for (g, k), vs in SERVED.items() for v in vs])
def test_every_served_version_is_accepted(group: str, kind: str, version: str) -> None:
    found = lookup(f"{group}/{version}", kind)
    assert found is not None and found.group == group and found.kind == kind


def test_a_version_nobody_serves_names_the_ones_that_are() -> None:
    doc = {"apiVersion": "gateway.networking.k8s.io/v1alpha9", "kind": "TLSRoute",
           "metadata": {"name": "r", "namespace": "d"}, "spec": {"rules": [{}]}}
    with pytest.raises(InvalidObject) as e:
        parse_object(doc)
    assert "gateway.networking.k8s.io/v1alpha3" in e.value.reason and "v1alpha9" in e.value.reason
