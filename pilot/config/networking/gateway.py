"""Gateway (istiod's ValidateGateway): servers, their ports and hosts, and server-side TLS settings
(also used by Sidecar ingress listeners)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from pilot.config.base import K8sObject, StrictModel, Unsupported
from pilot.config.networking.common import UNIX_PREFIX
from pilot.config.networking.validation import (
    _HTTP_PROTOCOLS,
    _PROTOCOLS,
    _TLS_PROTOCOLS,
    OptStr,
    _fail,
    _raise_if,
    _unix_address,
    is_dns1123_label,
    is_ip,
    validate_namespace_slash_host,
    validate_port,
)


# --- Gateway ----------------------------------------------------------------------------------------
class ServerTLSSettings(StrictModel):
    mode: Literal["PASSTHROUGH", "SIMPLE", "MUTUAL", "AUTO_PASSTHROUGH", "ISTIO_MUTUAL",
                  "OPTIONAL_MUTUAL"] = "PASSTHROUGH"
    credential_name: OptStr = None
    # Certificates from files: istiod hands the paths to the gateway's agent (SDS `file-cert:` /
    # `file-root:`), which routers here do not have. With credentialName istiod ignores
    # caCertificates (the CA comes from the Secret); refused here rather than ignored.
    server_certificate: Unsupported = None
    private_key: Unsupported = None
    ca_certificates: Unsupported = None
    subject_alt_names: list[str] = Field(default_factory=list)
    https_redirect: bool | None = None
    min_protocol_version: Literal["TLS_AUTO", "TLSV1_0", "TLSV1_1", "TLSV1_2", "TLSV1_3"] | None = None
    max_protocol_version: Literal["TLS_AUTO", "TLSV1_0", "TLSV1_1", "TLSV1_2", "TLSV1_3"] | None = None
    cipher_suites: list[str] = Field(default_factory=list)
    # Not generated: refused when set, so a listener is never served with weaker checks or other
    # certificates than written.
    ca_crl: Unsupported = None
    # Several certificates (RSA and ECDSA) from Secrets; the first one's CA checks clients.
    credential_names: list[str] = Field(default_factory=list, max_length=2)
    # A CA-only Secret needs the SDS server to serve it as a validation context: not yet.
    ca_cert_credential_name: Unsupported = None
    tls_certificates: Unsupported = None
    # Pins on the client certificate: only where one is asked for (MUTUAL, OPTIONAL_MUTUAL).
    verify_certificate_spki: list[str] = Field(default_factory=list)
    verify_certificate_hash: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _valid(self) -> ServerTLSSettings:
        errs = []
        if (self.verify_certificate_spki or self.verify_certificate_hash) \
                and self.mode not in ("MUTUAL", "OPTIONAL_MUTUAL"):
            errs.append(f"verifyCertificateSpki/verifyCertificateHash are not supported with mode "
                        f"{self.mode} (only MUTUAL and OPTIONAL_MUTUAL check a client certificate here)")
        sources = sum((bool(self.server_certificate and self.private_key), bool(self.credential_name),
                       bool(self.credential_names)))
        if sources > 1:
            errs.append("only one of credentialName, credentialNames, serverCertificate/privateKey should be "
                        "specified")
        if any(not n for n in self.credential_names):
            errs.append("credentialNames: a name cannot be empty")
        if self.mode == "ISTIO_MUTUAL":
            for field, what in (("server_certificate", "server certificate"), ("private_key", "private key"),
                                ("ca_certificates", "CA bundle"), ("credential_name", "credentialName"),
                                ("credential_names", "credentialNames")):
                if getattr(self, field):
                    errs.append(f"ISTIO_MUTUAL TLS cannot have associated {what}")
        elif self.mode in ("SIMPLE", "MUTUAL", "OPTIONAL_MUTUAL") and not self.credential_name \
                and not self.credential_names:
            mode = "SIMPLE" if self.mode == "SIMPLE" else "MUTUAL"
            if not self.server_certificate:
                errs.append(f"{mode} TLS requires a server certificate (or credentialName)")
            if not self.private_key:
                errs.append(f"{mode} TLS requires a private key (or credentialName)")
            if mode == "MUTUAL" and not self.ca_certificates:
                errs.append("MUTUAL TLS requires a client CA bundle (or credentialName)")
        _raise_if(errs)
        return self


class GatewayPort(StrictModel):
    number: int = 0
    protocol: str = ""
    name: str = ""
    target_port: int | None = None


class Server(StrictModel):
    port: GatewayPort | None = Field(default=None, validate_default=True)
    hosts: list[str] = Field(default_factory=list, validate_default=True)
    tls: ServerTLSSettings | None = None
    name: str = ""
    bind: str | None = None
    default_endpoint: Unsupported = None  # a Sidecar-style forward target for the gateway: not generated

    @field_validator("port")
    @classmethod
    def _required(cls, port: GatewayPort | None) -> GatewayPort | None:
        if port is None:
            _fail("port is required")
        return port

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        if not hosts:
            _fail("server config must contain at least one host")
        _raise_if([f"[{i}] {h!r}: {e}" for i, h in enumerate(hosts)
                   for e in validate_namespace_slash_host(h, is_gateway=True)])
        return hosts

    @model_validator(mode="after")
    def _valid(self) -> Server:
        port, bind = self.port, self.bind or ""
        assert port is not None  # the field validator requires it
        errs = []
        proto = port.protocol.lower()
        if proto not in _PROTOCOLS:
            errs.append(f"port.protocol: invalid protocol {port.protocol!r}, supported protocols are HTTP, HTTP2, "
                        "GRPC, GRPC-WEB, HTTPS, TLS, MONGO, REDIS, MYSQL, TCP")
        if (port.number > 0 or not bind.startswith(UNIX_PREFIX)) and (err := validate_port(port.number)):
            errs.append(f"port.number: {err}")
        if port.target_port:
            errs.append("port.targetPort: targetPort has no impact on Gateways")
        if not port.name:
            errs.append("port.name: port name must be set")
        if bind.startswith(UNIX_PREFIX):
            if err := _unix_address(bind[len(UNIX_PREFIX):]):
                errs.append(f"bind: {err}")
            if port.number != 0:
                errs.append("port.number: port number must be 0 for unix domain socket")
            if not errs:  # valid for istiod; no listener here would bind it
                errs.append("bind: a unix domain socket bind is not supported")
        elif bind and not is_ip(bind):
            errs.append(f"bind: {bind} is not a valid IP")
        if proto in _PROTOCOLS:
            if proto in _TLS_PROTOCOLS and self.tls is None:
                errs.append("tls: server must have TLS settings for HTTPS/TLS protocols")
            elif proto not in _TLS_PROTOCOLS and self.tls is not None:
                t = self.tls
                if proto in _HTTP_PROTOCOLS:  # only httpsRedirect makes sense on plain HTTP
                    if (t.mode not in ("PASSTHROUGH", "AUTO_PASSTHROUGH") or t.ca_certificates
                            or t.private_key or t.server_certificate):
                        errs.append("tls: server cannot have TLS settings for plain text HTTP ports")
                else:
                    errs.append("tls: server cannot have TLS settings for non HTTPS/TLS ports")
        _raise_if(errs)
        return self


class GatewaySpec(StrictModel):
    selector: dict[str, str] = Field(default_factory=dict)
    servers: list[Server] = Field(default_factory=list, validate_default=True)

    @field_validator("servers")
    @classmethod
    def _servers(cls, servers: list[Server]) -> list[Server]:
        if not servers:
            _fail("gateway must have at least one server")
        names: set[str] = set()
        for s in servers:
            assert s.port is not None
            if s.port.name in names:
                _fail(f"port names in servers must be unique: duplicate name {s.port.name}")
            names.add(s.port.name)
        return servers


class Gateway(K8sObject):
    kind: Literal["Gateway"] = "Gateway"
    spec: GatewaySpec

    @model_validator(mode="after")
    def _name(self) -> Gateway:
        # VirtualServices refer to gateways as namespace/name, so the name cannot contain dots.
        if not is_dns1123_label(self.metadata.name):
            _fail(f"metadata.name: invalid gateway name {self.metadata.name!r} (must be a DNS label)")
        return self
