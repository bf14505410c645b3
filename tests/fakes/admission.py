"""Validating admission webhooks, as kube-apiserver calls them (a FakeApiServer mixin).

A CREATE or UPDATE (POST, PUT, PATCH of the main resource; dry runs too) of a resource that a
stored admissionregistration.k8s.io/v1 ValidatingWebhookConfiguration's rules match is sent as
an admission.k8s.io/v1 AdmissionReview over HTTPS to the webhook, after the object has been
built (defaults, generated name) and before it is stored:

* ``clientConfig.url`` is called as given; ``clientConfig.service`` is resolved through
  ``webhook_services[(namespace, name, port)] = (host, port)`` (tests point it at 127.0.0.1; a
  callable returning that, or None for "no endpoints", is asked on every call)
  and the certificate is verified for ``NAME.NAMESPACE.svc`` against ``clientConfig.caBundle``
  (the system roots without one), as the apiserver does;
* a denial becomes the apiserver's error: ``admission webhook "NAME" denied the request: MSG``
  with the response's status code (400 when it sets none below 400);
* a webhook that cannot be called (no route, TLS failure, timeout, a non-200 answer, a broken
  response) is skipped with ``failurePolicy: Ignore`` and fails the request with ``Fail`` (the
  default): 500 InternalError ``failed calling webhook "NAME": ...``.

Selectors (namespaceSelector, objectSelector) and matchConditions are not evaluated; every
call is logged in ``admission_calls`` (webhook name, operation, outcome).
"""

from __future__ import annotations

import base64
import ssl
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from .common import JSON, FakeApiError
from .resources import ResourceType

_CONFIGS = ("admissionregistration.k8s.io", "validatingwebhookconfigurations")


class Admission:
    """Calls the validating webhooks of stored configurations (state set up in FakeApiServer)."""

    webhook_services: dict[tuple[str, str, int], tuple[str, int] | Callable[[], tuple[str, int] | None]]
    admission_calls: list[tuple[str, str, str]]

    def _matching_webhooks(self, rtype: ResourceType, operation: str) -> list[JSON]:
        store = self._stores.get(_CONFIGS)  # type: ignore[attr-defined]
        if store is None or rtype.store_key == _CONFIGS:
            return []
        out = []
        for config in store.objects.values():
            for wh in config.get("webhooks") or []:
                if any(_rule_matches(r, rtype, operation) for r in wh.get("rules") or []):
                    out.append(wh)
        return out

    async def _admit(self, rtype: ResourceType, operation: str, obj: JSON, old: JSON | None,
                     dry_run: bool) -> None:
        """Raise the apiserver's error when a webhook denies (or cannot be called and fails closed)."""
        for wh in self._matching_webhooks(rtype, operation):
            name = wh.get("name", "")
            try:
                response = await self._call_webhook(wh, rtype, operation, obj, old, dry_run)
            except Exception as exc:  # noqa: BLE001 - any failure to get an answer
                if wh.get("failurePolicy", "Fail") == "Ignore":
                    self.admission_calls.append((name, operation, f"ignored: {exc}"))
                    continue
                self.admission_calls.append((name, operation, f"failed: {exc}"))
                message = f'Internal error occurred: failed calling webhook "{name}": {exc}'
                raise FakeApiError(500, "InternalError", message) from None
            if response.get("allowed") is True:
                self.admission_calls.append((name, operation, "allowed"))
                continue
            status = response.get("status") or {}
            code = status.get("code") if isinstance(status.get("code"), int) else 0
            message = status.get("message") or "without explanation"
            self.admission_calls.append((name, operation, f"denied: {message}"))
            raise FakeApiError(max(code, 400), status.get("reason") or "",
                               f'admission webhook "{name}" denied the request: {message}')

    async def _call_webhook(self, wh: JSON, rtype: ResourceType, operation: str, obj: JSON, old: JSON | None,
                            dry_run: bool) -> JSON:
        client = wh.get("clientConfig") or {}
        ca = client.get("caBundle")
        if ca:
            ctx = ssl.create_default_context(cadata=base64.b64decode(ca).decode())
        else:
            ctx = ssl.create_default_context()
        if client.get("url"):
            url = client["url"]
            server_hostname = urlsplit(url).hostname
        else:
            ref = client.get("service") or {}
            ns, svc, port = ref.get("namespace", ""), ref.get("name", ""), int(ref.get("port") or 443)
            target = self.webhook_services.get((ns, svc, port))
            if callable(target):  # resolved per call: a server whose port is known only later
                target = target()
            if target is None:
                raise ConnectionError(f"service {ns}/{svc}:{port} has no endpoints")
            server_hostname = f"{svc}.{ns}.svc"
            url = f"https://{target[0]}:{target[1]}{ref.get('path') or '/'}"
        meta = obj.get("metadata") or {}
        request: JSON = {
            "uid": str(uuid.uuid4()),
            "kind": {"group": rtype.group, "version": rtype.version, "kind": rtype.kind},
            "resource": {"group": rtype.group, "version": rtype.version, "resource": rtype.plural},
            "requestKind": {"group": rtype.group, "version": rtype.version, "kind": rtype.kind},
            "requestResource": {"group": rtype.group, "version": rtype.version, "resource": rtype.plural},
            "name": meta.get("name", ""), "namespace": meta.get("namespace", ""),
            "operation": operation, "userInfo": {"username": "fake-apiserver-client"},
            "object": obj, "oldObject": old, "dryRun": dry_run, "options": None,
        }
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        timeout = aiohttp.ClientTimeout(total=float(wh.get("timeoutSeconds") or 10))
        connector = aiohttp.TCPConnector(ssl=ctx)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session, \
                session.post(url, json=review, server_hostname=server_hostname) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise ConnectionError(f"the server responded with {resp.status}: {text[:200]}")
            answer: Any = await resp.json(content_type=None)
        response = answer.get("response") if isinstance(answer, dict) else None
        if not isinstance(response, dict) or response.get("uid") != request["uid"]:
            raise ValueError(f"expected response.uid={request['uid']!r}, got {answer!r:.200}")
        return response


def _rule_matches(rule: JSON, rtype: ResourceType, operation: str) -> bool:
    def has(values: Any, value: str) -> bool:
        return isinstance(values, list) and ("*" in values or value in values)

    scope = rule.get("scope", "*")
    return (has(rule.get("operations"), operation) and has(rule.get("apiGroups"), rtype.group)
            and has(rule.get("apiVersions"), rtype.version) and has(rule.get("resources"), rtype.plural)
            and (scope == "*" or scope == ("Namespaced" if rtype.namespaced else "Cluster")))
