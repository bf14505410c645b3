"""Shared by the e2e tests: YAML builders for the objects they write, and /metrics parsing."""

from __future__ import annotations

import re
import textwrap

NAMESPACE = "default"
DOMAIN = "cluster.local"


def fqdn(name: str, namespace: str = NAMESPACE) -> str:
    return f"{name}.{namespace}.svc.{DOMAIN}"


def service_yaml(name: str, port: int, *, port_name: str = "http", namespace: str = NAMESPACE) -> str:
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Service
        metadata:
          name: {name}
          namespace: {namespace}
        spec:
          ports:
          - name: {port_name}
            port: {port}
        """)


def endpoint_slice_yaml(service: str, backend_port: int, *, name: str | None = None,
                        port_name: str = "http", address: str = "127.0.0.1",
                        namespace: str = NAMESPACE) -> str:
    return textwrap.dedent(f"""\
        apiVersion: discovery.k8s.io/v1
        kind: EndpointSlice
        metadata:
          name: {name or service + '-1'}
          namespace: {namespace}
          labels:
            kubernetes.io/service-name: {service}
        addressType: IPv4
        ports:
        - name: {port_name}
          port: {backend_port}
        endpoints:
        - addresses: ["{address}"]
          conditions: {{ready: true}}
        """)


def parse_counters(metrics_text: str, family: str) -> dict[str, float]:
    """`family{type="x"} N` lines -> {"x": N} (istiod's counter names carry no `_total`)."""
    out: dict[str, float] = {}
    for m in re.finditer(rf'^{family}\{{type="([^"]+)"\}} ([0-9.e+]+)$', metrics_text, re.MULTILINE):
        out[m.group(1)] = float(m.group(2))
    return out


def parse_histogram(metrics_text: str, family: str) -> tuple[float, float]:
    """(count, sum) of an unlabelled histogram."""
    count = re.search(rf"^{family}_count ([0-9.e+]+)$", metrics_text, re.MULTILINE)
    total = re.search(rf"^{family}_sum ([0-9.e+]+)$", metrics_text, re.MULTILINE)
    return (float(count.group(1)) if count else 0.0, float(total.group(1)) if total else 0.0)
