"""WasmPlugin (extensions.istio.io v1alpha1), strict, with istiod's webhook rules
(pkg/config/validation validateWasmPlugin) and what this control plane can apply.

The module is loaded by Envoy's V8 runtime (the PyPI Envoy build has it) from a local file
(`file://`) or, for `http://`/`https://` and OCI images (`oci://`, or a URL without scheme, as
istiod reads it), from the file pilot-agent fetched, verified against `sha256` (for an image: its
manifest digest) and cached (pilot/agent/wasm.py, pilot/agent/oci.py, as istio-agent's fetcher):
the HTTP Wasm filter is inserted into the proxy's HTTP filter chain (pilot/networking/wasm.py).
`verificationKey` (istio-agent verifies no signatures either) and NETWORK filters are refused
naming the field.
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


def is_local(url: str) -> bool:
    """A module on the proxy's filesystem, read by Envoy (else one the agent fetches)."""
    return url.startswith("file://")


def is_image(url: str) -> bool:
    """An OCI image: `oci://` or, as istiod reads it, a URL without scheme."""
    return url.startswith("oci://") or "://" not in url


def fetch_url(url: str) -> str:
    """The URL the agent is given (istiod: no scheme means oci://)."""
    return url if "://" in url else f"oci://{url}"


class WasmPluginSpec(StrictModel):
    selector: Selector | None = None
    target_ref: PolicyTargetReference | None = None
    target_refs: list[PolicyTargetReference] = Field(default_factory=list)
    url: str = Field(min_length=1)
    sha256: str = ""
    # Read by the agent's fetcher (http(s) modules and images); local files have nothing to pull.
    image_pull_policy: Literal["UNSPECIFIED_POLICY", "IfNotPresent", "Always"] = "UNSPECIFIED_POLICY"
    # A kubernetes.io/dockerconfigjson Secret of the plugin's namespace (istiod forces that
    # namespace), for OCI images.
    image_pull_secret: str = Field(default="", max_length=253)
    # istio-agent verifies no image signature (its fetcher has a TODO for it): accepting the key
    # would promise a check nothing makes.
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
        if isinstance(data, dict) and (data.get("verificationKey") or data.get("verification_key")):
            raise ValueError("verificationKey: not supported: istio-agent verifies no image signature (its "
                             "image fetcher has none), so neither does this agent; pin the image by "
                             "sha256 or digest instead")
        return data

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        scheme, sep, rest = v.partition("://")
        if not sep:  # istiod: a URL without scheme is an OCI image reference
            scheme, rest = "oci", v
        if scheme == "file":
            if not rest.startswith("/"):
                raise ValueError("url: file:// needs an absolute path (file:///path/to/module.wasm)")
            return v
        if scheme in ("http", "https"):
            if not rest or rest.startswith("/"):
                raise ValueError(f"url: {scheme}:// needs a host")
            return v
        if scheme == "oci":
            if not rest or rest.startswith("/") or any(c.isspace() for c in rest):
                raise ValueError("url: an OCI image needs a registry and repository (oci://REGISTRY/REPO:TAG)")
            return v
        raise ValueError(f"url: unsupported scheme {scheme!r} (file://, http://, https:// and oci:// are supported)")

    @field_validator("sha256")
    @classmethod
    def _sha(cls, v: str) -> str:
        if v and not _SHA256.match(v):
            raise ValueError("sha256: must be 64 lowercase hex digits")
        return v

    @model_validator(mode="after")
    def _valid(self) -> WasmPluginSpec:
        problems = selector_problems(self.selector, self.target_ref, self.target_refs)
        if self.is_local and self.sha256:
            problems.append("sha256: not supported for file:// modules (Envoy does not verify local files; "
                            "the agent checks sha256 only for modules it fetches)")
        if self.is_local and self.image_pull_policy != "UNSPECIFIED_POLICY":
            problems.append("imagePullPolicy: only applies to modules the agent fetches (http(s)://, oci://), "
                            "not to file://")
        if self.image_pull_secret and not self.is_image:
            problems.append("imagePullSecret: only used to pull OCI images (oci://); istio-agent sends no "
                            "credentials for file:// or http(s):// modules")
        _raise_if(problems)
        return self

    @property
    def target_references(self) -> list[PolicyTargetReference]:
        return ([self.target_ref] if self.target_ref is not None else []) + list(self.target_refs)

    @property
    def is_local(self) -> bool:
        return is_local(self.url)

    @property
    def is_image(self) -> bool:
        return is_image(self.url)


class WasmPlugin(StrictObject):
    kind: Literal["WasmPlugin"] = "WasmPlugin"
    spec: WasmPluginSpec
