"""WasmPlugin (extensions.istio.io v1alpha1), strict, with istiod's webhook rules
(pkg/config/validation validateWasmPlugin) and what this control plane can apply.

The module is loaded by Envoy's V8 runtime (the PyPI Envoy build has it) from a local file
(`file://`): the HTTP Wasm filter is inserted into the proxy's HTTP filter chain
(pilot/networking/wasm.py). What needs istio-agent's module fetcher (`oci://`, and `http(s)://`
which istiod also hands to the agent) or a NETWORK filter is refused naming the field.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from pilot.config.base import StrictModel, StrictObject, Unsupported
from pilot.config.networking.validation import _raise_if
from pilot.config.security.common import PolicyTargetReference, Selector, selector_problems

GROUP = "extensions.istio.io"
VERSIONS = ("v1alpha1",)

Phase = Literal["UNSPECIFIED_PHASE", "AUTHN", "AUTHZ", "STATS"]
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class PortSelector(StrictModel):
    number: int = Field(ge=1, le=65535)


class TrafficSelector(StrictModel):
    mode: Literal["UNDEFINED", "CLIENT", "SERVER", "CLIENT_AND_SERVER"] = "UNDEFINED"
    ports: list[PortSelector] = Field(default_factory=list)


class EnvVar(StrictModel):
    name: str = Field(min_length=1)
    value_from: Literal["INLINE", "HOST"] = "INLINE"
    value: str = ""

    @model_validator(mode="after")
    def _valid(self) -> EnvVar:
        if self.value_from == "HOST" and self.value:
            raise ValueError("value may only be set when valueFrom is INLINE")
        return self


class VmConfig(StrictModel):
    env: list[EnvVar] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> VmConfig:
        names = [e.name for e in self.env]
        if len(names) != len(set(names)):
            raise ValueError("env: duplicate env var name")
        return self


class WasmPluginSpec(StrictModel):
    selector: Selector | None = None
    target_ref: PolicyTargetReference | None = None
    target_refs: list[PolicyTargetReference] = Field(default_factory=list)
    url: str = Field(min_length=1)
    sha256: str = ""
    # Pull settings are istio-agent's module fetcher's (OCI images); local files have none.
    image_pull_policy: Unsupported = None
    image_pull_secret: Unsupported = None
    verification_key: Unsupported = None
    plugin_config: dict[str, Any] | None = None
    plugin_name: str = ""
    phase: Phase = "UNSPECIFIED_PHASE"
    priority: int | None = None
    fail_strategy: Literal["FAIL_CLOSE", "FAIL_OPEN"] = "FAIL_CLOSE"
    vm_config: VmConfig | None = None
    match: list[TrafficSelector] = Field(default_factory=list)
    type: Literal["UNSPECIFIED_PLUGIN_TYPE", "HTTP"] = "UNSPECIFIED_PLUGIN_TYPE"

    @model_validator(mode="before")
    @classmethod
    def _network(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("type") == "NETWORK":
            raise ValueError("type: NETWORK is not supported (only HTTP plugins are applied)")
        return data

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        scheme, sep, rest = v.partition("://")
        if not sep:  # istiod: a URL without scheme is an OCI image reference
            scheme = "oci"
        if scheme == "file":
            if not rest.startswith("/"):
                raise ValueError("url: file:// needs an absolute path (file:///path/to/module.wasm)")
            return v
        if scheme in ("oci", "http", "https"):
            raise ValueError(f"url: {scheme}:// is not supported: istiod hands remote modules to istio-agent's "
                             "fetcher, which this control plane's agent does not have; use file:// "
                             "with the module on the proxy's filesystem")
        raise ValueError(f"url: unsupported scheme {scheme!r} (file:// is supported)")

    @field_validator("sha256")
    @classmethod
    def _sha(cls, v: str) -> str:
        if v and not _SHA256.match(v):
            raise ValueError("sha256: must be 64 lowercase hex digits")
        return v

    @model_validator(mode="after")
    def _valid(self) -> WasmPluginSpec:
        problems = selector_problems(self.selector, self.target_ref, self.target_refs)
        if self.sha256:  # only file:// is accepted, and Envoy reads local modules unverified
            problems.append("sha256: not supported for file:// modules (Envoy does not verify local files; "
                            "it checks sha256 only for modules it fetches)")
        _raise_if(problems)
        return self

    @property
    def target_references(self) -> list[PolicyTargetReference]:
        return ([self.target_ref] if self.target_ref is not None else []) + list(self.target_refs)

    @property
    def file_path(self) -> str:
        return self.url.partition("://")[2]


class WasmPlugin(StrictObject):
    kind: Literal["WasmPlugin"] = "WasmPlugin"
    spec: WasmPluginSpec
