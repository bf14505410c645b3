"""SDS generator: credentials (`kubernetes://NAME`, `kubernetes://NAME-cacert`) over ADS, for
gateway servers and for DestinationRule client TLS (`tls.credentialName`).

As istiod's SecretGen for credentialName:
- Only a proxy whose identity was verified gets secrets: it connected on the secure port
  (15012) with a client certificate or token, and the node's namespace is the one it proved
  (pilot.security.ca_server admits nothing else). Plaintext xDS (15010) never serves a private
  key, whatever the node id claims: anyone can write a node id. Proxyless gRPC clients and
  ztunnel get none (they do not read these resources).
- Only Secrets in the proxy's own namespace (`NAME`, or `NAMESPACE/NAME` naming that same
  namespace), or, for a router, in another namespace when a Gateway API Gateway of the router's
  namespace presents it under a ReferenceGrant. A proxy in another namespace asking for a name
  gets no resource (the response is sent, empty). In Kubernetes mode the proxy's service
  account must also be allowed to list Secrets there (pilot.security.secret_access).
- `kubernetes://NAME` is the certificate chain and key of Secret NAME (tls.crt/tls.key or
  cert/key); `kubernetes://NAME-cacert` is the CA bundle (ca.crt or cacert) of a Secret named
  NAME-cacert if there is one, else of Secret NAME.
- A Secret that is not a usable credential (bad base64, no PEM, missing keys) gives no resource
  and a logged reason, once per Secret revision; it never fails the push. Parsed material lives
  in the PushContext's gateway index (pilot.model.gateways), so no private key outlives the
  push that served it or the Secret it came from.
A Secret change reaches the proxies whose SDS answer read it (recorded, pilot/model/dependencies.py,
through PushContext.gateway_secret); the resource version is the content hash,
so a rotated Secret reaches Envoy as a new version of the same name and Envoy swaps the
certificate without touching the listener.
"""

from __future__ import annotations

from functools import lru_cache

from pilot import logging as plog
from pilot.model.credentials import CONFIGMAP_PREFIX, SECRET_CA_PREFIX, CredentialError
from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.model.store import Entry
from pilot.networking.gateway import CA_SUFFIX, SDS_PREFIX, tls_certificate_secret, validation_context_secret
from pilot.xds.cache import CachedResource, XdsCache
from pilot.xds.typeurls import SECRET

log = plog.get("sds")


def refusal(proxy: Proxy) -> str | None:
    """Why `proxy` may be given no credential at all, or None. Reads only the proxy's traits
    (the generation memo's key), so a memoized answer is never shared across this line."""
    traits = proxy.traits
    if traits.type not in ("router", "sidecar") or traits.generator:
        return "credentials are served only to Envoy gateways and sidecars"
    if not traits.mesh_tls:
        return ("the proxy has not proved an identity: credentials are served only on the secure xDS port "
                "(15012) to a client authenticated by certificate or token")
    return None


def generate(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
             cache: XdsCache) -> list[CachedResource]:
    if not requested or refusal(proxy) is not None:
        return []  # DiscoveryServer logs and counts the refusal, once per stream
    out: list[CachedResource] = []
    for name in sorted(requested):
        res = _resource(ctx, proxy, name, cache)
        if res is not None:
            out.append(res)
    return out


def _resource(ctx: PushContext, proxy: Proxy, name: str, cache: XdsCache) -> CachedResource | None:
    for prefix, kind in ((CONFIGMAP_PREFIX, "ConfigMap"), (SECRET_CA_PREFIX, "Secret")):
        if name.startswith(prefix) and name.endswith(CA_SUFFIX) and proxy.type == "router":
            # A Gateway's spec.tls.frontend CA: only one a Gateway of the router's namespace uses
            # (translation checked it and its ReferenceGrant); no other object is served this way.
            namespace, _, obj = name[len(prefix):-len(CA_SUFFIX)].partition("/")
            ca = ctx.gateway_client_ca(proxy.namespace, kind, namespace, obj, name)
            if ca is None:
                log.info("gateway client CA not in use by this namespace's Gateways", name=name)
                return None
            return cache.resource(SECRET, name, validation_context_secret, name, ca,
                                  origins=(f"{kind}/{namespace}/{obj}",))
    if not name.startswith(SDS_PREFIX):
        return None
    ref = name[len(SDS_PREFIX):]
    namespace, slash, secret_name = ref.rpartition("/")
    if not slash:
        namespace, secret_name = proxy.namespace, ref
    granted = (namespace != proxy.namespace and proxy.type == "router"
               and ctx.allows_credential(proxy.namespace, namespace, secret_name))
    if not secret_name or (namespace != proxy.namespace and not granted):
        log.info("secret in another namespace refused", name=name, proxy_namespace=proxy.namespace)
        return None
    if secret_name.endswith(CA_SUFFIX):
        entry = (ctx.gateway_secret(namespace, secret_name)
                 or ctx.gateway_secret(namespace, secret_name[:-len(CA_SUFFIX)]))
        if entry is None:
            log.info("gateway CA secret not found", name=name, namespace=namespace)
            return None
        ca = ctx.gateways.ca_certificates(entry)
        if isinstance(ca, CredentialError):
            _unusable(_origin(entry), entry.revision, "has no usable CA certificate", str(ca))
            return None
        return cache.resource(SECRET, name, validation_context_secret, name, ca, origins=(_origin(entry),))
    entry = ctx.gateway_secret(namespace, secret_name)
    if entry is None:
        log.info("gateway secret not found", name=name, namespace=namespace)
        return None
    material = ctx.gateways.certificate(entry)
    if isinstance(material, CredentialError):
        _unusable(_origin(entry), entry.revision, "is not a usable certificate", str(material))
        return None
    return cache.resource(SECRET, name, tls_certificate_secret, name, material.cert_chain, material.private_key,
                          origins=(_origin(entry),))


def _origin(e: Entry) -> str:
    return f"Secret/{e.key.namespace}/{e.key.name}"


@lru_cache(maxsize=1024)  # holds names and reasons only: one warning per Secret revision
def _unusable(origin: str, revision: int, what: str, reason: str) -> None:
    log.warning(f"gateway secret {what}; not served", secret=origin, revision=revision, reason=reason)
