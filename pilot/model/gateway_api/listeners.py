"""Gateways and their listeners as this controller judges them (pure): which listeners can be
served, which route kinds each accepts, which certificate it presents, which conflict, and the
Gateway's address (the Service of its deployment).

Protocols: HTTP and HTTPS take HTTPRoute and GRPCRoute; TLS Passthrough takes TLSRoute; TLS
Terminate takes TLSRoute and TCPRoute (istiod's: the connection is decrypted, then forwarded as
the route says); TCP takes TCPRoute. Anything else (UDP, lowercase `http`, unknown) is not
accepted, and takes no kind, but is reported Programmed as istiod does (Accepted says why).

Conflicts (istiod's listenersDistinct, gatewaycommon/listener_conflicts.go), in merge order, each
listener against the earlier ones that were not themselves conflicted (a conflicted listener frees
its place): on another port, never; TCP/UDP against TCP/UDP or against HTTP/HTTPS/TLS on one port,
always (ProtocolConflict); two of HTTP/HTTPS/TLS on one port when their hostnames are equal (unset
is `*`), ProtocolConflict if their protocols differ, else HostnameConflict; any other protocol
(lowercase, unknown) only with its own kind (HostnameConflict). So HTTP a.example and HTTPS
b.example may share a port, as in istiod; istiod's MergeGateways then serves only the class of the
port's first server (model/gateways.py skips the other with a reason), which is what is served
here too. A conflicted listener is neither accepted nor programmed, nor a route parent; its
message is istiod's. The listeners of the ListenerSets a Gateway allows (listener_sets.py) are
judged the same way, after the Gateway's own and against them (one PortBook for the merged list).

Addresses: the Service istiod's automated deployment creates, `<gateway>-<class>` in the
Gateway's namespace, or the Services `Hostname` addresses name; their cluster-local hostnames
are the addresses. The Gateway is Programmed when every one exists in its namespace and exposes
every listener port (else AddressNotUsable, naming each miss). (Load balancer addresses are not
reported: a Service's status is not read, so that load-balancer updates never cause a push.)
`IPAddress` addresses are not supported beyond a single one (istiod binds only Hostname
addresses; one IP is a request to the managed deployment's load balancer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pilot.config.core import ConfigMap, Secret, Service
from pilot.config.gateway_api import GROUP, KubernetesGateway, ListenerSet
from pilot.config.gateway_api.gateway import TLS_TERMINATE_MODE
from pilot.model.credentials import (
    CA_KEYS,
    CA_SUFFIX,
    CERT_KEYS,
    CONFIGMAP_PREFIX,
    SECRET_CA_PREFIX,
    CredentialError,
    ca_bundle,
    config_map_ca_bundle,
    key_pair_problem,
)
from pilot.model.gateway_api.conditions import condition, sorted_conditions
from pilot.model.gateway_api.references import ReferenceGrants
from pilot.model.store import ConfigKey, Entry

HTTP_KINDS = ((GROUP, "HTTPRoute"), (GROUP, "GRPCRoute"))
TLS_PASSTHROUGH_KINDS = ((GROUP, "TLSRoute"),)
TLS_TERMINATE_KINDS = ((GROUP, "TLSRoute"), (GROUP, "TCPRoute"))
TCP_KINDS = ((GROUP, "TCPRoute"),)
_PORT_CLASS = {"HTTP": "http", "HTTPS": "tls", "TLS": "tls", "TCP": "tcp"}


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    reason: str
    message: str


ACCEPTED = Verdict(True, "Accepted", "No errors found")


@dataclass(frozen=True)
class ListenerState:
    gateway: Entry[KubernetesGateway]
    index: int
    kinds: tuple[tuple[str, str], ...]  # route (group, kind) that may attach
    accepted: Verdict
    conflicted: Verdict  # ok=True: conflicted
    resolved: Verdict
    credential: str = ""  # the internal server's credentialName: NAME, or NAMESPACE/NAME across namespaces
    tls_mode: str = ""  # a terminating listener's server mode: SIMPLE, MUTUAL, OPTIONAL_MUTUAL, ISTIO_MUTUAL
    # The ListenerSet whose listener this is (merged into `gateway`), or None for the Gateway's own.
    owner: Entry[ListenerSet] | None = None
    # Why it is not Programmed when nothing else says so (a ListenerSet's HTTPS listener without tls).
    unprogrammed: Verdict | None = None
    # spec.tls.frontend: the SDS name of the CA checking client certificates (configmap://NS/NAME-cacert
    # or kubernetes-gateway://NS/NAME-cacert), its checked PEM, and whether an unverified (or no)
    # certificate is let through (AllowInsecureFallback).
    client_ca: str = ""
    client_ca_pem: bytes = b""
    insecure_fallback: bool = False

    @property
    def spec(self):
        return (self.owner or self.gateway).obj.spec.listeners[self.index]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def owner_key(self) -> ConfigKey:
        """The route parent this listener belongs to: its ListenerSet, else its Gateway."""
        return (self.owner or self.gateway).key

    @property
    def namespace(self) -> str:
        """Where `allowedRoutes: Same` and its certificateRefs point: its owner's namespace."""
        return self.owner_key.namespace

    @property
    def server_name(self) -> str:
        """The internal server's (and Gateway's) listener part: unique across the merged
        listeners (a ListenerSet's listener may share its name with the Gateway's)."""
        if self.owner is None:
            return self.name
        return f"{self.owner.key.namespace}.{self.owner.key.name}.{self.name}"

    @property
    def bad_tls(self) -> bool:
        return self.resolved.reason in ("InvalidCertificateRef", "RefNotPermitted", "InvalidCACertificateRef",
                                        "InvalidCACertificateKind")

    @property
    def programmed(self) -> bool:
        """Served: becomes a server of the router (what istiod counts as a valid listener)."""
        return self.accepted.ok and not self.conflicted.ok and not self.bad_tls and self.unprogrammed is None

    @property
    def parent(self) -> bool:
        """Routes may name it as a parent (istiod: every listener of a Gateway but conflicted
        ones; one with an unsupported protocol takes no kind, one with a bad certificate still
        takes routes. Of a ListenerSet, only the programmed ones)."""
        if self.owner is not None:
            return self.programmed
        return not self.conflicted.ok

    @property
    def has_server(self) -> bool:
        """istiod builds a server for it (its port counts towards the address checks)."""
        return not self.conflicted.ok and self.unprogrammed is None

    def status(self, attached: int, generation: int) -> dict:
        # istiod's Programmed: False for a conflict (its reason) or bad TLS; an unsupported
        # protocol is reported by Accepted alone.
        if self.conflicted.ok:
            programmed = condition("Programmed", False, self.conflicted.reason, self.conflicted.message, generation)
        elif self.bad_tls:
            programmed = condition("Programmed", False, "Invalid", "Bad TLS configuration", generation)
        elif self.unprogrammed is not None:
            programmed = condition("Programmed", False, self.unprogrammed.reason, self.unprogrammed.message, generation)
        else:
            programmed = condition("Programmed", True, "Programmed", "No errors found", generation)
        return {
            "name": self.name,
            "supportedKinds": [{"group": g, "kind": k} for g, k in self.kinds],
            "attachedRoutes": attached,
            "conditions": sorted_conditions([
                condition("Accepted", self.accepted.ok, self.accepted.reason, self.accepted.message, generation),
                condition("Conflicted", self.conflicted.ok, self.conflicted.reason, self.conflicted.message,
                          generation),
                programmed,
                condition("ResolvedRefs", self.resolved.ok, self.resolved.reason, self.resolved.message, generation),
            ]),
        }


@dataclass(frozen=True)
class GatewayState:
    entry: Entry[KubernetesGateway]
    class_name: str
    listeners: tuple[ListenerState, ...]
    accepted: Verdict
    programmed: Verdict
    addresses: tuple[tuple[str, str], ...]  # (type, value)

    report_listeners: bool = True  # False: no address could be used at all (istiod writes no listeners)
    # The ListenerSets the Gateway allows, in merge precedence order, with their listeners.
    sets: tuple[tuple[Entry[ListenerSet], tuple[ListenerState, ...]], ...] = ()
    hosts: tuple[str, ...] = ()  # the Service hostnames it binds to (ListenerSets' address checks)
    address_problem: Verdict | None = None  # an ignored address (ListenerSets: "Parent not accepted")

    @property
    def merged(self) -> tuple[ListenerState, ...]:
        """The Gateway's listeners then its ListenerSets' (the spec's merge order)."""
        return self.listeners + tuple(ls for _, listeners in self.sets for ls in listeners)

    @property
    def attached_sets(self) -> int:
        """ListenerSets with a programmed listener (istiod's attachedListenerSets)."""
        return sum(1 for _, listeners in self.sets if any(ls.programmed for ls in listeners))

    def status(self, attached: Mapping[str, int]) -> dict:
        gen = self.entry.obj.metadata.generation
        out: dict = {}
        if self.addresses:
            out["addresses"] = [{"type": t, "value": v} for t, v in self.addresses]
        out["conditions"] = sorted_conditions([
            condition("Accepted", self.accepted.ok, self.accepted.reason, self.accepted.message, gen),
            condition("Programmed", self.programmed.ok, self.programmed.reason, self.programmed.message, gen),
            *_insecure_frontend(self.entry, gen),
        ])
        if self.report_listeners:
            out["listeners"] = [ls.status(attached.get(ls.name, 0), gen) for ls in self.listeners]
        if self.attached_sets:
            out["attachedListenerSets"] = self.attached_sets
        return out


def _insecure_frontend(gateway: Entry[KubernetesGateway], gen: int) -> list[dict]:
    """istiod's InsecureFrontendValidationMode: some port lets clients in without a valid certificate."""
    tls = gateway.obj.spec.tls
    frontend = tls.frontend if tls is not None else None
    if frontend is None:
        return []
    validations = [frontend.default.validation, *(p.tls.validation for p in frontend.per_port)]
    if not any(v is not None and v.mode == "AllowInsecureFallback" for v in validations):
        return []
    return [condition("InsecureFrontendValidationMode", True, "ConfigurationChanged",
                      "Gateway is operating in AllowInsecureFallback mode for frontend validation", gen)]


def _supported_kinds(listener) -> tuple[tuple[tuple[str, str], ...], Verdict | None]:
    proto = listener.protocol
    native: tuple[tuple[str, str], ...]
    if proto in ("HTTP", "HTTPS"):
        native = HTTP_KINDS
    elif proto == "TLS":
        native = TLS_PASSTHROUGH_KINDS if listener.tls.mode == "Passthrough" else TLS_TERMINATE_KINDS
    elif proto == "TCP":
        native = TCP_KINDS
    else:
        return (), None
    wanted = [k.key() for k in listener.allowed_routes.kinds]
    if not wanted:
        return native, None
    ok = tuple(k for k in dict.fromkeys(wanted) if k in native)
    bad = [f"{g}/{k}" for g, k in wanted if (g, k) not in native]
    if bad:
        return ok, Verdict(False, "InvalidRouteKinds", f"unsupported route kind(s) for {proto}: {', '.join(bad)}")
    return ok, None


def _certificate(gateway: Entry[KubernetesGateway], owner: Entry, listener,
                 secrets: Mapping[tuple[str, str], Entry[Secret]], grants: ReferenceGrants) -> tuple[str, Verdict | None]:
    """The credentialName for a terminating listener, or why there is none. `owner`: the Gateway
    or ListenerSet the listener is written in (its namespace and kind are what references and
    ReferenceGrants are relative to); the credential is named relative to the Gateway's
    namespace, where its routers run."""
    ref = listener.tls.certificate_refs[0] if listener.tls.certificate_refs else None
    if ref is None:
        return "", Verdict(False, "InvalidCertificateRef", "no certificateRefs (tls.options alone are not supported)")
    ns = ref.namespace or owner.key.namespace
    where = f"{ref.group or 'core'}/{ref.kind}/{ns}/{ref.name}"
    if ref.group not in ("", "core") or ref.kind != "Secret":
        return "", Verdict(False, "InvalidCertificateRef", f"invalid certificate reference {where}, only Secret is "
                                                            "allowed")
    from_kind = "Gateway" if owner.key.kind == "KubernetesGateway" else owner.key.kind
    if not grants.allowed(GROUP, from_kind, owner.key.namespace, "", "Secret", ns, ref.name):
        return "", Verdict(False, "RefNotPermitted", f"certificate reference {where} is not permitted (missing a "
                                                     "ReferenceGrant?)")
    secret = secrets.get((ns, ref.name))
    if secret is None:
        return "", Verdict(False, "InvalidCertificateRef", f"invalid certificate reference {where}, secret {ns}/"
                                                            f"{ref.name} not found")
    data = secret.obj.data
    if not any(c in data and k in data for c, k in CERT_KEYS):
        return "", Verdict(False, "InvalidCertificateRef", f"invalid certificate reference {where}, the secret has "
                                                            "no tls.crt and tls.key")
    # A listener is never programmed with a certificate Envoy would refuse (its SDS update
    # NACKed, the listener stuck warming): not PEM, or a key that is not the certificate's.
    problem = key_pair_problem(secret.obj.reveal())
    if problem:
        return "", Verdict(False, "InvalidCertificateRef", f"invalid certificate reference {where}, the certificate "
                                                            f"is malformed: {problem}")
    return (ref.name if ns == gateway.key.namespace else f"{ns}/{ref.name}"), None


def _client_ca(credential: str, namespace: str, secrets: Mapping[tuple[str, str], Entry[Secret]]) -> Verdict | None:
    """MUTUAL/OPTIONAL_MUTUAL verify clients against the CA the listener's Secret holds (or a
    Secret NAME-cacert beside it), as an Istio Gateway's credentialName does. Without one the
    listener is refused here rather than left waiting in Envoy for a CA that never comes."""
    if "/" in credential:  # a grant names one Secret, not a NAME-cacert beside it
        return Verdict(False, "InvalidCertificateRef", f"{TLS_TERMINATE_MODE} verifies clients with a CA of the "
                                                       "Gateway's namespace: the certificate must be there too")
    for candidate in (credential, credential + CA_SUFFIX):
        secret = secrets.get((namespace, candidate))
        if secret is not None and any(k in secret.obj.data for k in CA_KEYS):
            return None
    return Verdict(False, "InvalidCertificateRef", f"secret {namespace}/{credential} has no ca.crt (nor is there a "
                                                   f"secret {namespace}/{credential}{CA_SUFFIX}) to verify client "
                                                   f"certificates ({TLS_TERMINATE_MODE})")


def _frontend_ca(gateway: Entry[KubernetesGateway], listener,
                 configmaps: Mapping[tuple[str, str], Entry[ConfigMap]],
                 secrets: Mapping[tuple[str, str], Entry[Secret]],
                 grants: ReferenceGrants) -> tuple[str, bytes, bool, Verdict | None]:
    """The Gateway's `spec.tls.frontend` for this listener's port, as istiod's buildTLS: (the CA's
    SDS name, its checked PEM, insecure fallback, why it cannot be used). A CA that is missing or
    not PEM refuses the listener here, so Envoy never waits for (or rejects) a validation context.
    istiod's kinds: a ConfigMap's `ca.crt` (configmap://NS/NAME-cacert) or a Secret's
    (kubernetes-gateway://NS/NAME-cacert)."""
    tls = gateway.obj.spec.tls
    validation = tls.frontend.for_port(listener.port) if tls is not None and tls.frontend is not None else None
    if validation is None:
        return "", b"", False, None
    if len(validation.ca_certificate_refs) > 1:
        return "", b"", False, Verdict(False, "InvalidCACertificateRef", "only one caCertificateRef is supported")
    ref = validation.ca_certificate_refs[0]
    ns = ref.namespace or gateway.key.namespace
    where = f"{ref.group}/{ref.kind}/{ref.name}.{ref.namespace or ''}"
    if ref.group not in ("", "core") or ref.kind not in ("ConfigMap", "Secret"):
        return "", b"", False, Verdict(False, "InvalidCACertificateKind", f"invalid CA certificate reference {where}, "
                                                                         "only secret and configmap are allowed")
    if ns != gateway.key.namespace and not grants.allowed(GROUP, "Gateway", gateway.key.namespace, "", ref.kind,
                                                          ns, ref.name):
        return "", b"", False, Verdict(False, "RefNotPermitted", f"caCertificateRef {ns}/{ref.name} not accessible "
                                                                 f"to a Gateway in namespace {gateway.key.namespace!r} "
                                                                 "(missing a ReferenceGrant?)")

    def bad(why: str) -> tuple[str, bytes, bool, Verdict]:
        return "", b"", False, Verdict(False, "InvalidCACertificateRef", f"invalid CA certificate reference {where}, "
                                                                         f"{why}")

    if ref.kind == "ConfigMap":
        cm = configmaps.get((ns, ref.name))
        if cm is None:
            return bad(f"configmap {ns}/{ref.name} not found")
        if not any(cm.obj.data.get(k) for k in CA_KEYS):
            return bad("found no ca.crt")
        try:
            pem = config_map_ca_bundle(cm.obj.data)
        except CredentialError:
            return bad("the bundle is malformed")
        prefix = CONFIGMAP_PREFIX
    else:
        secret = secrets.get((ns, ref.name))
        if secret is None:
            return bad(f"secret {ns}/{ref.name} not found")
        data = secret.obj.reveal()
        if not any(k in data for k in CA_KEYS):
            return bad("found no ca.crt")
        try:
            pem = ca_bundle(data)
        except CredentialError:
            return bad("the bundle is malformed")
        prefix = SECRET_CA_PREFIX
    return f"{prefix}{ns}/{ref.name}{CA_SUFFIX}", pem, validation.mode == "AllowInsecureFallback", None


_L4 = ("TCP", "UDP")
_HTTP_LIKE = ("HTTP", "HTTPS", "TLS")
CONFLICT_MESSAGE = "Listener has a conflict with another listener attached to the same Gateway"


def _distinct(a: tuple[int, str, str], b: tuple[int, str, str]) -> bool:
    """istiod's listenersDistinct over (port, protocol, hostname-or-*)."""
    (port_a, proto_a, host_a), (port_b, proto_b, host_b) = a, b
    if port_a != port_b:
        return True
    if proto_a in _L4 and (proto_b in _L4 or proto_b in _HTTP_LIKE) or proto_a in _HTTP_LIKE and proto_b in _L4:
        return False
    if proto_a in _HTTP_LIKE and proto_b in _HTTP_LIKE:
        return host_a != host_b
    return proto_a != proto_b


def conflict_reason(a: tuple[int, str, str], b: tuple[int, str, str]) -> str:
    """istiod's listenerConflictReason for two listeners that are not distinct."""
    if a[1] in _L4 and b[1] in _L4 or a[1] != b[1]:
        return "ProtocolConflict"
    return "HostnameConflict"


@dataclass
class PortBook:
    """The listeners that won their place so far across a Gateway's merged listeners (the
    Gateway's first, then its ListenerSets' in precedence order), as (port, protocol, host)."""

    winners: list[tuple[int, str, str]] = field(default_factory=list)

    def claim(self, port: int, protocol: str, hostname: str) -> str | None:
        """The conflict reason against the first winner this listener is not distinct from, else
        None (and it becomes a winner)."""
        me = (port, protocol, hostname or "*")
        for prior in self.winners:
            if not _distinct(me, prior):
                return conflict_reason(me, prior)
        self.winners.append(me)
        return None


def evaluate_listeners(gateway: Entry[KubernetesGateway], secrets: Mapping[tuple[str, str], Entry[Secret]],
                       grants: ReferenceGrants, owner: Entry[ListenerSet] | None = None,
                       book: PortBook | None = None,
                       configmaps: Mapping[tuple[str, str], Entry[ConfigMap]] | None = None) -> tuple[ListenerState, ...]:
    """The listeners of `owner` (a ListenerSet merged into `gateway`), else of the Gateway;
    `book` carries the ports taken by the listeners merged before them."""
    out: list[ListenerState] = []
    book = book if book is not None else PortBook()
    source = owner or gateway
    for i, listener in enumerate(source.obj.spec.listeners):
        kinds, kind_problem = _supported_kinds(listener)
        resolved = kind_problem or Verdict(True, "ResolvedRefs", "No errors found")
        accepted = ACCEPTED
        conflicted = Verdict(False, "NoConflicts", "No errors found")
        unprogrammed = None
        credential = tls_mode = client_ca = ""
        client_ca_pem = b""
        insecure = False
        cls = _PORT_CLASS.get(listener.protocol)
        # istiod judges conflicts first, over every listener (an unsupported protocol's too).
        reason = book.claim(listener.port, listener.protocol, listener.hostname or "")
        if reason is not None:
            conflicted = Verdict(True, reason, CONFLICT_MESSAGE)
        if cls is None and not conflicted.ok:
            hint = f'. hint: "{listener.protocol.upper()}" (uppercase) may be supported' \
                if listener.protocol.upper() in _PORT_CLASS and listener.protocol != listener.protocol.upper() else ""
            accepted = Verdict(False, "UnsupportedProtocol", f'protocol "{listener.protocol}" is unsupported{hint}')
        else:
            if conflicted.ok:
                accepted = Verdict(False, conflicted.reason, conflicted.message)
            elif listener.tls is None and listener.protocol in ("HTTPS", "TLS"):
                # Only a ListenerSet's may lack it (its CRD allows that): istiod's placeholder.
                accepted = Verdict(False, "UnsupportedProtocol",
                                   f"protocol is {listener.protocol} but no TLS section is defined")
                unprogrammed = Verdict(False, "Invalid", "Bad TLS configuration")
            elif listener.tls is not None and listener.tls.mode == "Terminate":
                tls_mode = listener.tls.terminate_mode
                if tls_mode != "ISTIO_MUTUAL":  # (istiod: the router's own certificate, refs unread)
                    credential, problem = _certificate(gateway, source, listener, secrets, grants)
                    if problem is None:
                        client_ca, client_ca_pem, insecure, problem = _frontend_ca(
                            gateway, listener, configmaps or {}, secrets, grants)
                        if problem is not None:  # istiod: a CA problem also refuses Accepted
                            accepted = Verdict(False, "NoValidCACertificate", problem.message)
                    if problem is None and client_ca:
                        # istiod: the frontend CA makes it MUTUAL (AllowInsecureFallback: OPTIONAL_MUTUAL
                        # accepting untrusted certificates); an explicit terminate mode still wins.
                        if tls_mode == "SIMPLE":
                            tls_mode = "OPTIONAL_MUTUAL" if insecure else "MUTUAL"
                        else:
                            insecure = False
                    elif problem is None and tls_mode != "SIMPLE":
                        problem = _client_ca(credential, gateway.key.namespace, secrets)
                    if problem is not None:
                        resolved = problem
        out.append(ListenerState(gateway, i, kinds if cls is not None else (), accepted, conflicted, resolved,
                                 credential, tls_mode, owner, unprogrammed, client_ca, client_ca_pem, insecure))
    return tuple(out)


def _human_join(items: list[str]) -> str:
    if len(items) <= 2:
        return " and ".join(items)
    return ", ".join(items[:-1]) + ", and " + items[-1]


def _gateway_services(gateway: Entry[KubernetesGateway], class_name: str, domain: str) -> tuple[list[str], Verdict | None]:
    """istiod's extractGatewayServices: the Service hostnames the Gateway binds to, and why an
    address is refused. No address, or a single IP address (a request for the managed
    deployment's load balancer): the managed `<name>-<class>` Service. Otherwise every Hostname
    address (a short name is a Service in the Gateway's namespace); other types are ignored."""
    spec = gateway.obj.spec
    ns, name = gateway.key.namespace, gateway.key.name
    addresses = spec.addresses
    if not addresses or (len(addresses) == 1 and addresses[0].type == "IPAddress"):
        return [f"{name}-{class_name}.{ns}.svc.{domain}"], None
    services, skipped = [], []
    for a in addresses:
        if a.type != "Hostname":
            skipped.append(a.value)
        else:
            services.append(a.value if "." in a.value else f"{a.value}.{ns}.svc.{domain}")
    if skipped:
        return services, Verdict(False, "UnsupportedAddress", f"only Hostname is supported, ignoring [{' '.join(skipped)}]")
    return services, None


def resolve_addresses(namespace: str, hosts: list[str], ports: list[int],
                       services: Mapping[tuple[str, str], Entry[Service]], domain: str) -> tuple[list[str], list[str], bool]:
    """istiod's ResolveGatewayInstances, on Services alone: (HOST:PORT assigned, warnings, all
    usable). A hostname must be a Service of the Gateway's namespace exposing every listener
    port. (Endpoints are not read: a Service's endpoints changing never rewrites status.)"""
    internal: set[str] = set()
    warnings: list[str] = []
    usable = True
    suffix = f".svc.{domain}"
    for host in hosts:
        # A Service's hostname is NAME.NAMESPACE.svc.DOMAIN: at most one Service anywhere has it.
        name, _, rest = host.partition(".")
        svc_ns = rest[:-len(suffix)] if rest.endswith(suffix) and "." not in rest[:-len(suffix)] else None
        svc = services.get((namespace, name)) if svc_ns == namespace else None
        if svc is None:
            elsewhere = svc_ns is not None and (svc_ns, name) in services
            warnings.append(f'hostname "{host}" not found in namespace "{namespace}", but it was found in namespace(s) '
                            f'"{svc_ns}"' if elsewhere else f'hostname "{host}" not found')
            usable = False
            continue
        exposed = {p.port for p in svc.obj.spec.ports}
        for port in ports:
            if port in exposed:
                internal.add(f"{host}:{port}")
            else:
                warnings.append(f'port {port} not found for hostname "{host}"')
                usable = False
    return sorted(internal), sorted(warnings), usable


def programmed_verdict(internal: list[str], warnings: list[str], usable: bool) -> Verdict:
    if warnings:
        reason = "AddressNotAssigned" if usable else "AddressNotUsable"
        if internal:
            return Verdict(False, reason, f"Assigned to service(s) {_human_join(internal)}, but failed to assign to "
                                          f"all requested addresses: {'; '.join(warnings)}")
        return Verdict(False, reason, f"Failed to assign to any requested addresses: {'; '.join(warnings)}")
    if internal:
        return Verdict(True, "Programmed", f"Resource programmed, assigned to service(s) {_human_join(internal)}")
    return Verdict(True, "Programmed", "Resource programmed")


def evaluate_gateway(gateway: Entry[KubernetesGateway], class_name: str,
                     services: Mapping[tuple[str, str], Entry[Service]],
                     secrets: Mapping[tuple[str, str], Entry[Secret]], grants: ReferenceGrants, domain: str,
                     sets: tuple[Entry[ListenerSet], ...] = (),
                     configmaps: Mapping[tuple[str, str], Entry[ConfigMap]] | None = None) -> GatewayState:
    """As istiod's GatewayCollection: with no usable address at all the Gateway is refused whole
    (no listener served or reported); an ignored address alone refuses Accepted, its listeners
    still served. Accepted says ListenersNotValid when some listener cannot be served.
    `sets`: the ListenerSets it allows, in merge precedence order (oldest first, then by
    namespace/name); their listeners come after its own and lose conflicts to them."""
    hosts, address_problem = _gateway_services(gateway, class_name, domain)
    if not hosts:
        assert address_problem is not None
        return GatewayState(gateway, class_name, (), address_problem,
                            Verdict(False, "UnsupportedAddress", "Failed to assign to any requested addresses"), (),
                            report_listeners=False, sets=tuple((s, ()) for s in sets), address_problem=address_problem)
    book = PortBook()
    listeners = evaluate_listeners(gateway, secrets, grants, book=book, configmaps=configmaps)
    merged = tuple((s, evaluate_listeners(gateway, secrets, grants, s, book, configmaps)) for s in sets)
    valid = sum(1 for ls in listeners if ls.programmed)
    if address_problem is not None:
        accepted = address_problem
    elif listeners and valid == 0:
        accepted = Verdict(False, "ListenersNotValid", "None of the Gateway's listeners are valid")
    elif valid < len(listeners):
        accepted = Verdict(True, "ListenersNotValid", "One or more of the Gateway's listeners are invalid")
    else:
        accepted = Verdict(True, "Accepted", "Resource accepted")
    # istiod checks the ports of its own servers and of its ListenerSets' programmed listeners
    ports = sorted({ls.spec.port for ls in listeners if ls.parent}
                   | {ls.spec.port for _, ls_ in merged for ls in ls_ if ls.programmed})
    internal, warnings, usable = resolve_addresses(gateway.key.namespace, hosts, ports, services, domain)
    addresses = tuple(("Hostname", h) for h in dict.fromkeys(i.rpartition(":")[0] for i in internal))
    return GatewayState(gateway, class_name, listeners, accepted, programmed_verdict(internal, warnings, usable),
                        addresses, sets=merged, hosts=tuple(hosts), address_problem=address_problem)
