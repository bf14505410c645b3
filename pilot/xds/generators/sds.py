"""SDS generator: gateway credentials (`kubernetes://NAME`, `kubernetes://NAME-cacert`) over ADS.

As istiod's SecretGen for credentialName:
- Only router proxies get secrets, and only Secrets in their own namespace (`NAME`, or
  `NAMESPACE/NAME` naming that same namespace), or in another namespace when a Gateway API
  Gateway of the router's namespace presents it under a ReferenceGrant. A sidecar, or a router
  in another namespace, asking for a name gets no resource (the response is sent, empty).
- `kubernetes://NAME` is the certificate chain and key of Secret NAME (tls.crt/tls.key or
  cert/key); `kubernetes://NAME-cacert` is the CA bundle (ca.crt or cacert) of a Secret named
  NAME-cacert if there is one, else of Secret NAME.
- A Secret that is not a usable credential (bad base64, no PEM, missing keys) gives no resource
  and a logged reason, once per Secret revision; it never fails the push.
Secret changes are full pushes (model/events.py); the resource version is the content hash,
so a rotated Secret reaches Envoy as a new version of the same name and Envoy swaps the
certificate without touching the listener.
"""

from __future__ import annotations

from functools import lru_cache

from pilot import logging as plog
from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.model.store import Entry
from pilot.networking import credentials
from pilot.networking.gateway import CA_SUFFIX, SDS_PREFIX, tls_certificate_secret, validation_context_secret
from pilot.xds.cache import CachedResource, XdsCache
from pilot.xds.typeurls import SECRET

log = plog.get("sds")


def generate(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
             cache: XdsCache) -> list[CachedResource]:
    if proxy.type != "router" or not requested:
        if requested:
            log.debug("secrets are only served to gateways", proxy_type=proxy.type, names=sorted(requested)[:10])
        return []
    out: list[CachedResource] = []
    for name in sorted(requested):
        res = _resource(ctx, proxy, name, cache)
        if res is not None:
            out.append(res)
    return out


def _resource(ctx: PushContext, proxy: Proxy, name: str, cache: XdsCache) -> CachedResource | None:
    if not name.startswith(SDS_PREFIX):
        return None
    ref = name[len(SDS_PREFIX):]
    namespace, slash, secret_name = ref.rpartition("/")
    if not slash:
        namespace, secret_name = proxy.namespace, ref
    granted = namespace != proxy.namespace and ctx.allows_credential(proxy.namespace, namespace,
                                                                                 secret_name)
    if not secret_name or (namespace != proxy.namespace and not granted):
        log.info("secret in another namespace refused", name=name, proxy_namespace=proxy.namespace)
        return None
    if secret_name.endswith(CA_SUFFIX):
        entry = (ctx.gateway_secret(namespace, secret_name)
                 or ctx.gateway_secret(namespace, secret_name[:-len(CA_SUFFIX)]))
        ca = _ca(entry) if entry is not None else None
        if ca is None:
            if entry is None:
                log.info("gateway CA secret not found", name=name, namespace=namespace)
            return None
        return cache.resource(SECRET, name, validation_context_secret, name, ca, origins=(_origin(entry),))
    entry = ctx.gateway_secret(namespace, secret_name)
    if entry is None:
        log.info("gateway secret not found", name=name, namespace=namespace)
        return None
    material = _certificate(entry)
    if material is None:
        return None
    return cache.resource(SECRET, name, tls_certificate_secret, name, material.cert_chain, material.private_key,
                          origins=(_origin(entry),))


def _origin(e: Entry) -> str:
    return f"Secret/{e.key.namespace}/{e.key.name}"


# Parsed once per Secret content (the data items are the key, so equal Entries from different
# Stores, as in tests, cannot share a verdict), so a bad Secret is reported once, not on every
# push to every gateway.
def _certificate(entry: Entry) -> credentials.CertificateAndKey | None:
    return _parse_certificate(_origin(entry), tuple(sorted(entry.obj.data.items())))  # type: ignore[attr-defined]


def _ca(entry: Entry) -> bytes | None:
    return _parse_ca(_origin(entry), tuple(sorted(entry.obj.data.items())))  # type: ignore[attr-defined]


@lru_cache(maxsize=1024)
def _parse_certificate(origin: str, items: tuple[tuple[str, str], ...]) -> credentials.CertificateAndKey | None:
    try:
        return credentials.certificate_and_key(dict(items))
    except credentials.CredentialError as e:
        log.warning("gateway secret is not a usable certificate; not served", secret=origin, reason=str(e))
        return None


@lru_cache(maxsize=1024)
def _parse_ca(origin: str, items: tuple[tuple[str, str], ...]) -> bytes | None:
    try:
        return credentials.ca_bundle(dict(items))
    except credentials.CredentialError as e:
        log.warning("gateway secret has no usable CA certificate; not served", secret=origin, reason=str(e))
        return None
