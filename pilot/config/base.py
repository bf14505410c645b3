"""Shared pieces of every Kubernetes-shaped object: metadata and the camelCase model base."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError


class Model(BaseModel):
    """Users write camelCase YAML; code reads snake_case. Unknown fields are ignored, as the
    apiserver's pruning would do for the kinds we read, so a newer manifest never breaks us."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class StrictModel(Model):
    """What users write in the kinds we own the meaning of (Istio and Gateway API specs, MeshConfig
    parts we apply): an unknown field is a rejection naming its path, as istiod's webhook and
    `istioctl validate` refuse it, never a silent drop. Both the JSON (camelCase) and the proto
    (snake_case) spelling are accepted, as istio's protobuf JSON decoding does."""

    model_config = ConfigDict(extra="forbid")


UNSUPPORTED_MARK = "x-pilot-unsupported"


def _refuse_unsupported(value: Any, info: ValidationInfo) -> Any:
    # Validators do not run on defaults, so this runs only when the user wrote the field.
    if value is None:
        return None  # `field: null` is the same as leaving it out
    name = to_camel(info.field_name) if info.field_name else "field"
    raise PydanticCustomError("unsupported", "{field} is not supported", {"field": name})


# A field istiod applies that this control plane does not generate yet: the object is accepted
# only while the field is absent, and refused naming it when present. Marked, so the published
# table of supported fields (and the CRD schemas) are derived from the models.
Unsupported = Annotated[Any, AfterValidator(_refuse_unsupported), Field(json_schema_extra={UNSUPPORTED_MARK: True})]


def refused_because(reason: str) -> AfterValidator:
    """The validator of an Unsupported field that says why: `FIELD is not supported: REASON`.
    Use as `Annotated[Any, refused_because(R), Field(json_schema_extra={UNSUPPORTED_MARK: True},
    description=R)]` (the description is the field's note in the table of supported fields)."""

    def refuse(value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return None
        name = to_camel(info.field_name) if info.field_name else "field"
        raise PydanticCustomError("unsupported", "{field} is not supported: {reason}",
                                  {"field": name, "reason": reason})

    return AfterValidator(refuse)


def fails_closed(how: str, default: Any = None) -> Any:
    """A field that is accepted but never applied as written: where the API itself prescribes the
    refusal (Gateway API: a rule with a filter the implementation lacks answers 500 and the route's
    status says why; a CUSTOM AuthorizationPolicy without its provider denies everything). `how`
    says what happens instead, for the table of supported fields."""
    return Field(default=default, json_schema_extra={UNSUPPORTED_MARK: how})


class ObjectMeta(Model):
    name: str = Field(min_length=1, max_length=253)
    namespace: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    resource_version: str = ""
    uid: str = ""
    generation: int = 0
    creation_timestamp: str = ""


class K8sObject(Model):
    api_version: str
    kind: str
    metadata: ObjectMeta

    # The name the Store (and ConfigKey) files this kind under, when the wire kind alone is
    # ambiguous: gateway.networking.k8s.io's Gateway is "KubernetesGateway", as in istiod.
    CONFIG_KIND: ClassVar[str] = ""

    @property
    def config_kind(self) -> str:
        return type(self).CONFIG_KIND or self.kind

    def spec_equal(self, other: K8sObject) -> bool:
        """True when nothing that can change generated config differs: bookkeeping such as
        resourceVersion, uid, generation and non-Istio annotations is ignored so a no-op update
        causes no push.
        `status` is compared: the models keep only status fields the registry reads (a Pod's IP
        and phase), and an update judged equal is dropped, so ignoring it would keep a stale IP."""
        if type(self) is not type(other):
            return False
        ignore = {"metadata": {"resource_version", "uid", "generation", "annotations", "creation_timestamp"}}
        return (self.model_dump(exclude=ignore) == other.model_dump(exclude=ignore)
                and _meaningful(self.metadata.annotations) == _meaningful(other.metadata.annotations))


class StrictObject(K8sObject):
    """A kind whose meaning we own (Istio and Gateway API): besides the envelope (apiVersion, kind,
    metadata) and `spec`, only `status` may appear at the top level; `specs:` or `sepc:` would
    otherwise leave the object with an empty spec (a PeerAuthentication that enforces nothing).
    kubectl's strict field validation refuses them too. `status` is accepted and ignored here
    (never compared, never dumped); kinds whose status we write model their own."""

    model_config = ConfigDict(extra="forbid")

    status: Any = Field(default=None, exclude=True)


def _meaningful(annotations: dict[str, str]) -> dict[str, str]:
    """Annotations in Istio's domains can change proxy config; others (kubectl's
    last-applied-configuration, deployment tooling) change on every apply and must not push."""
    return {k: v for k, v in annotations.items() if "istio.io/" in k}
