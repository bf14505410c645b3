"""The control plane replicas from the Kubernetes API: the running istiod pods (label `app=istiod`
in the istio namespace, as deploy/ labels them), each at its pod IP and its `http-monitoring`
container port (15014 when unnamed). The pod IPs must be reachable from where pilotctl runs (in
the cluster, or a flat network); from outside, port-forward each pod and pass `--addr`."""

from __future__ import annotations

import asyncio
import os

from pilot.pilotctl.client import CtlError

MONITORING_PORT_NAME, MONITORING_PORT = "http-monitoring", 15014


def replica_addresses(pods: list[dict]) -> list[str]:
    out = []
    for pod in pods:
        status = pod.get("status") or {}
        ip = status.get("podIP")
        if status.get("phase") != "Running" or not ip or pod.get("metadata", {}).get("deletionTimestamp"):
            continue
        port = MONITORING_PORT
        for c in (pod.get("spec") or {}).get("containers") or []:
            for p in c.get("ports") or []:
                if p.get("name") == MONITORING_PORT_NAME and p.get("containerPort"):
                    port = int(p["containerPort"])
        out.append(f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}")
    return sorted(out)


async def _list_pods(kubeconfig: str, namespace: str, selector: str, timeout: float) -> list[dict]:
    # Imported here: the Kubernetes client costs a noticeable start-up time every other command avoids.
    import aiohttp

    from pilot.sources.kube.client import ApiError, Kube, load_api_client

    if not os.path.isfile(kubeconfig):
        raise CtlError(f"kubeconfig {kubeconfig} does not exist")
    try:
        api = await load_api_client(kubeconfig, "pilotctl")
    except Exception as e:  # noqa: BLE001 - the config loader raises many kinds; each is a bad kubeconfig
        raise CtlError(f"cannot use kubeconfig {kubeconfig}: {e}") from None
    kube = Kube(api)
    try:
        body = await kube.request("GET", f"/api/v1/namespaces/{namespace}/pods",
                                  query={"labelSelector": selector}, timeout=timeout)
    except ApiError as e:
        raise CtlError(f"cannot list istiod pods in {namespace}: {e}") from None
    except (TimeoutError, OSError, aiohttp.ClientError) as e:
        raise CtlError(f"cannot reach the Kubernetes API of {kubeconfig}: {str(e) or type(e).__name__}") from None
    finally:
        await kube.close()
    return (body or {}).get("items") or []


def discover(kubeconfig: str, namespace: str, selector: str, timeout: float) -> list[str]:
    pods = asyncio.run(_list_pods(kubeconfig, namespace, selector, timeout))
    addrs = replica_addresses(pods)
    if not addrs:
        raise CtlError(f"no running pod in {namespace} matches {selector!r} (of {len(pods)} listed)")
    return addrs
