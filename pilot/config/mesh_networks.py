"""MeshNetworks (istio.mesh.v1alpha1.MeshNetworks): the `meshNetworks` key of the `istio`
ConfigMap, which names the networks of a multi-network mesh, which endpoints belong to each and
the gateways that reach it from the others (pilot/model/networks.py applies it).

Strict, as MeshConfig parts we apply: an unknown field or a bad CIDR refuses the whole value
(the last good one stays in force) with its path, never a silent drop. A gateway's `locality`
is refused: istiod carries it in the API but builds nothing from it either.
"""

from __future__ import annotations

import ipaddress

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from pilot.config.base import StrictModel, Unsupported


class NetworkEndpoints(StrictModel):
    """Exactly one of: every endpoint of a registry (a cluster id), or those in a CIDR."""

    from_cidr: str = ""
    from_registry: str = ""

    @field_validator("from_cidr")
    @classmethod
    def _cidr(cls, v: str) -> str:
        if v:
            try:
                ipaddress.ip_network(v, strict=False)
            except ValueError:
                raise ValueError(f"fromCidr {v!r} is not a CIDR") from None
        return v

    @model_validator(mode="after")
    def _one(self) -> NetworkEndpoints:
        if bool(self.from_cidr) == bool(self.from_registry):
            raise ValueError("exactly one of fromCidr or fromRegistry must be set")
        return self


class NetworkGatewaySpec(StrictModel):
    """`address` (an IP; a hostname is not resolved here, as istiod with
    RESOLVE_HOSTNAME_GATEWAYS=false drops it) or `registryServiceName` (the FQDN of a Service
    whose LoadBalancer ingress IPs and externalIPs are the gateway's addresses)."""

    registry_service_name: str = ""
    address: str = ""
    port: int = Field(ge=1, le=65535)
    locality: Unsupported = None

    @model_validator(mode="after")
    def _one(self) -> NetworkGatewaySpec:
        if bool(self.address) == bool(self.registry_service_name):
            raise ValueError("exactly one of address or registryServiceName must be set")
        return self


class Network(StrictModel):
    endpoints: list[NetworkEndpoints] = Field(default_factory=list)
    gateways: list[NetworkGatewaySpec] = Field(default_factory=list)


class MeshNetworks(StrictModel):
    networks: dict[str, Network] = Field(default_factory=dict)


NO_MESH_NETWORKS = MeshNetworks()


class MeshNetworksError(ValueError):
    pass


def parse_mesh_networks(text: str) -> MeshNetworks:
    """The `meshNetworks` YAML (empty: no networks)."""
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as e:
        raise MeshNetworksError(f"meshNetworks is not valid YAML: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise MeshNetworksError("meshNetworks must be a YAML mapping")
    try:
        return MeshNetworks.model_validate(data)
    except ValidationError as e:
        detail = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
        raise MeshNetworksError(f"invalid meshNetworks: {detail}") from None
