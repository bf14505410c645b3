"""PeerAuthentication (istiod's ValidatePeerAuthentication): the mutual TLS mode a workload's
inbound side accepts, for the whole workload and per port."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from pilot.config.base import StrictModel, StrictObject
from pilot.config.networking.validation import _raise_if
from pilot.config.security.common import Selector

MtlsMode = Literal["UNSET", "DISABLE", "PERMISSIVE", "STRICT"]


class PeerAuthenticationMutualTLS(StrictModel):
    mode: MtlsMode = "UNSET"


class PeerAuthenticationSpec(StrictModel):
    selector: Selector | None = None
    mtls: PeerAuthenticationMutualTLS | None = None
    # Keys are workload (container) ports; YAML map keys arrive as strings and are read as ints.
    port_level_mtls: dict[int, PeerAuthenticationMutualTLS | None] | None = None

    @model_validator(mode="after")
    def _valid(self) -> PeerAuthenticationSpec:
        errs = []
        if (self.selector is None or not self.selector.match_labels) and self.port_level_mtls:
            errs.append("portLevelMtls: mesh/namespace peer authentication cannot have port level mTLS "
                        "(set a selector)")
        if self.port_level_mtls is not None and not self.port_level_mtls:
            errs.append("portLevelMtls: port level mTLS, if defined, must have at least one element")
        for port in self.port_level_mtls or {}:
            if not 1 <= port <= 65535:
                errs.append(f"portLevelMtls: port {port} must be in range 1..65535")
        _raise_if(errs)
        return self

    @property
    def mode(self) -> str:
        return self.mtls.mode if self.mtls is not None else "UNSET"

    def port_modes(self) -> dict[int, str]:
        return {p: (m.mode if m is not None else "UNSET") for p, m in (self.port_level_mtls or {}).items()}


class PeerAuthentication(StrictObject):
    kind: Literal["PeerAuthentication"] = "PeerAuthentication"
    spec: PeerAuthenticationSpec = PeerAuthenticationSpec()
