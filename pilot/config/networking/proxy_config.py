"""ProxyConfig (networking.istio.io v1beta1): per-workload proxy settings the injector delivers
(concurrency, image type, environment variables), with istiod's ValidateProxyConfig rules.

What it means (mesh-wide, namespace and workload precedence, merged with MeshConfig
`defaultConfig` and the pod's `proxy.istio.io/config`) is pilot/model/proxy_configs.py."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from pilot.config.base import K8sObject, StrictModel
from pilot.config.networking.common import WorkloadSelector
from pilot.config.networking.validation import _fail

# The suffix becomes part of an image tag (`TAG-TYPE`): what a tag may hold, lower case as the
# variants istio publishes (`default`, `debug`, `distroless`).
_IMAGE_TYPE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
# Environment variable names the container runtime accepts (Kubernetes' C_IDENTIFIER-ish rule).
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


class ProxyImage(StrictModel):
    image_type: str = ""

    @field_validator("image_type")
    @classmethod
    def _type(cls, value: str) -> str:
        if value and not _IMAGE_TYPE.match(value):
            _fail(f"imageType {value!r} is not a valid image tag suffix (e.g. default, debug, distroless)")
        return value


class ProxyConfigSpec(StrictModel):
    selector: WorkloadSelector | None = None
    # None: not set here, a lower layer's value stands; 0: one worker per core.
    concurrency: int | None = Field(default=None, ge=0)
    environment_variables: dict[str, str] = Field(default_factory=dict)
    image: ProxyImage | None = None

    @field_validator("environment_variables")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        bad = [k for k in env if not _ENV_NAME.match(k)]
        if bad:
            _fail(f"environmentVariables: invalid variable name(s) {', '.join(map(repr, bad))}")
        return env


class ProxyConfig(K8sObject):
    kind: Literal["ProxyConfig"] = "ProxyConfig"
    spec: ProxyConfigSpec = Field(default_factory=ProxyConfigSpec)
