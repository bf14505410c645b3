"""The Kubernetes API client: kubernetes-asyncio's ApiClient, configured from --kubeconfig or the
in-cluster service account, plus the raw JSON request every informer and writer goes through.

Objects are requested as plain JSON and validated into our own models: kubernetes-asyncio's
generated models are slow to build and would be converted again anyway. Every request carries
a timeout: without one a dead apiserver connection hangs forever.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from pilot import __version__

if TYPE_CHECKING:
    from kubernetes_asyncio import client

REQUEST_TIMEOUT = 30.0  # seconds, for every non-watch request


class ApiError(Exception):
    def __init__(self, status: int, reason: str, body: str = "") -> None:
        super().__init__(f"HTTP {status}: {reason}")
        self.status, self.reason, self.body = status, reason, body

    @classmethod
    def from_body(cls, status: int, text: str) -> ApiError:
        reason = text[:300] or "(empty body)"
        try:
            st = json.loads(text)
            reason = f"{st.get('reason', '')}: {st.get('message', '')}".strip(": ") or reason
        except ValueError:
            pass
        return cls(status, reason, text)


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(
        "/var/run/secrets/kubernetes.io/serviceaccount/token")


async def load_api_client(kubeconfig: str | None, identity: str = "") -> client.ApiClient:
    # Imported here, where Kubernetes mode begins: its generated API and ~850 model modules are
    # ~30 MB of RSS that file mode never uses (tests/unit/test_file_mode_imports.py).
    from kubernetes_asyncio import client, config

    cfg = client.Configuration()
    if kubeconfig:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    else:
        config.load_incluster_config(client_configuration=cfg)
    api = client.ApiClient(configuration=cfg)
    # Audit logs (and tests) can tell replicas apart.
    api.user_agent = f"pilot-discovery/{__version__}" + (f" ({identity})" if identity else "")
    return api


@dataclass
class Kube:
    """Thin JSON-over-HTTP access through the real client's auth, TLS and connection pool."""

    api: client.ApiClient

    async def request(self, method: str, path: str, *, query: dict[str, Any] | None = None,
                      body: Any = None, timeout: float = REQUEST_TIMEOUT,
                      content_type: str = "application/json") -> Any:
        resp = await self.open(method, path, query=query, body=body, timeout=timeout, content_type=content_type)
        try:
            text = await resp.text()
        finally:
            resp.release()
        return json.loads(text) if text else None

    async def open(self, method: str, path: str, *, query: dict[str, Any] | None = None, body: Any = None,
                   timeout: float = REQUEST_TIMEOUT, content_type: str = "application/json") -> aiohttp.ClientResponse:
        """The raw response, status already checked (non-2xx raises ApiError with the Status reason)."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        resp = await self.api.call_api(
            path, method, query_params=list((query or {}).items()), header_params=headers, body=body,
            auth_settings=["BearerToken"], _preload_content=False, _request_timeout=timeout)
        if not 200 <= resp.status < 300:
            text = await resp.text()
            resp.release()
            raise ApiError.from_body(resp.status, text)
        return resp

    async def close(self) -> None:
        await self.api.close()
