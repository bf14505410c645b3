"""pilot/model/proxy_configs.py: istiod's EffectiveProxyConfig precedence and tie-breaking."""

from __future__ import annotations

from pilot.config.networking.proxy_config import ProxyConfig
from pilot.model.proxy_configs import effective


def pc(ns: str, name: str, created: str = "", **spec) -> ProxyConfig:
    return ProxyConfig.model_validate({"apiVersion": "networking.istio.io/v1beta1", "kind": "ProxyConfig",
                                       "metadata": {"name": name, "namespace": ns, "creationTimestamp": created},
                                       "spec": spec})


def test_layers_and_the_oldest_of_each_layer_win():
    configs = [
        pc("shop", "newer", "2026-01-02T00:00:00Z", concurrency=4),
        pc("shop", "older", "2026-01-01T00:00:00Z", concurrency=3),
        pc("shop", "empty-selector", "2025-01-01T00:00:00Z", selector={"matchLabels": {}}, concurrency=9),
        pc("istio-system", "root", concurrency=2, environmentVariables={"A": "root"}),
        pc("shop", "web", selector={"matchLabels": {"app": "web"}}, environmentVariables={"B": "web"}),
    ]

    def run(ns: str, labels: dict, annotation: dict | None = None) -> dict:
        return effective({"concurrency": 1, "proxyMetadata": {"A": "mesh", "M": "m"}}, configs,
                         root_namespace="istio-system", namespace=ns, labels=labels, annotation=annotation)

    # The namespace's oldest wins over a newer one; a selector without labels is neither layer.
    assert run("shop", {"app": "cart"}) == {"concurrency": 3, "proxyMetadata": {"A": "root", "M": "m"}}
    assert run("shop", {"app": "web", "v": "1"})["proxyMetadata"] == {"A": "root", "M": "m", "B": "web"}
    assert run("other", {})["concurrency"] == 2
    # The root namespace's own workloads take its namespace-wide config once.
    assert run("istio-system", {})["concurrency"] == 2
    # The annotation is over the namespace, under the workload's ProxyConfig.
    assert run("shop", {"app": "cart"}, {"concurrency": 8})["concurrency"] == 8
    web = run("shop", {"app": "web"}, {"proxyMetadata": {"B": "pod"}, "concurrency": 8})
    assert web["proxyMetadata"]["B"] == "web" and web["concurrency"] == 8
