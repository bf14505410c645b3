"""`pilotctl x workload entry configure`: the files a VM needs to join the mesh, as
`istioctl x workload entry configure` writes them (istioctl/pkg/workload), from a WorkloadGroup
file and the cluster (the user's kubeconfig):

- `cluster.env`: the agent's environment (inbound ports, namespace, service, service account);
- `mesh.yaml`: `defaultConfig`, the mesh's (ConfigMap `istio`, or `istio-REV`) with the group's
  `proxy.istio.io/config` annotation applied and the workload's proxyMetadata (canonical service
  and revision, namespace, service account, trust domain, cluster, mesh, network, labels, and
  `ISTIO_META_AUTO_REGISTER_GROUP` with --autoregister), and the group's `probe` as `readinessProbe`;
- `root-cert.pem`: ConfigMap `istio-ca-root-cert` of the group's namespace;
- `istio-token`: a TokenRequest for the group's service account, audience `istio-ca`;
- `hosts`: `INGRESS_IP istiod[-REV].NS.svc` when --ingressIP is given (istioctl otherwise looks
  up the `istio-eastwestgateway` Service's load balancer address; that lookup is not done here,
  so the file is empty).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import yaml

from pilot.config.validation import InvalidObject, parse_object
from pilot.inject.pod import PROXY_CONFIG_ANNOTATION
from pilot.model.ambient.workloads import canonical
from pilot.model.proxy_configs import merge
from pilot.pilotctl.client import CtlError
from pilot.sources.kube.client import ApiError, Kube, load_api_client

CANONICAL_NAME = "service.istio.io/canonical-name"
CANONICAL_REVISION = "service.istio.io/canonical-revision"
EXCLUDED_PORTS = "15090,15021,15020"


def _env_lines(values: dict[str, str]) -> str:
    return "".join(f"{k}={values[k]}\n" for k in sorted(values))


def read_group(path: str) -> Any:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise CtlError(f"cannot read {path}: {e.strerror}") from None
    docs = [d for d in yaml.safe_load_all(text) if d]
    if len(docs) != 1 or not isinstance(docs[0], dict) or docs[0].get("kind") != "WorkloadGroup":
        raise CtlError(f"{path}: must hold exactly one WorkloadGroup")
    try:
        wg = parse_object(docs[0])
    except InvalidObject as e:
        raise CtlError(f"{path}: {e}") from None
    if not wg.metadata.namespace:
        raise CtlError(f"{path}: the WorkloadGroup must have a namespace")
    return wg


def files_for(wg: Any, mesh_text: str, root_cert: str, token: str, *, cluster_id: str, revision: str,
              istio_namespace: str, ingress_ip: str, internal_ip: str, autoregister: bool,
              dns_capture: bool) -> dict[str, str]:
    """The file name -> content of everything the VM needs (pure: the cluster was read before)."""
    name, ns = wg.metadata.name, wg.metadata.namespace
    we = wg.spec.template
    mesh = yaml.safe_load(mesh_text) if mesh_text.strip() else {}
    if not isinstance(mesh, dict):
        raise CtlError("the mesh config is not a YAML mapping")
    proxy = dict(mesh.get("defaultConfig") or {})
    metadata = dict(proxy.get("proxyMetadata") or {})
    annotation = wg.spec.metadata.annotations.get(PROXY_CONFIG_ANNOTATION)
    if annotation:
        over = yaml.safe_load(annotation)
        if not isinstance(over, dict):
            raise CtlError(f"annotation {PROXY_CONFIG_ANNOTATION}: must be a ProxyConfig object")
        proxy = merge(proxy, over)
    if wg.spec.probe is not None:  # istioctl: the group's probe is the agent's readinessProbe
        proxy["readinessProbe"] = wg.spec.probe.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    metadata.update(proxy.get("proxyMetadata") or {})
    labels = {**wg.spec.metadata.labels, **we.labels}  # istioctl: template labels override metadata's
    service, rev = canonical(labels, name)  # istio's labels.CanonicalService
    metadata.update({
        "CANONICAL_SERVICE": service, "CANONICAL_REVISION": rev, "POD_NAMESPACE": ns,
        "SERVICE_ACCOUNT": we.service_account or "default", "TRUST_DOMAIN": mesh.get("trustDomain") or "cluster.local",
        "ISTIO_META_CLUSTER_ID": cluster_id, "ISTIO_META_MESH_ID": str(proxy.get("meshId") or ""),
        "ISTIO_META_NETWORK": we.network or "", "ISTIO_META_WORKLOAD_NAME": name,
    })
    if we.ports:
        metadata["ISTIO_META_POD_PORTS"] = json.dumps(
            [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in sorted(we.ports.items())],
            separators=(",", ":"))
    labels[CANONICAL_NAME], labels[CANONICAL_REVISION] = service, rev
    metadata["ISTIO_METAJSON_LABELS"] = json.dumps(labels, sort_keys=True, separators=(",", ":"))
    if dns_capture:
        metadata["ISTIO_META_DNS_CAPTURE"] = "true"
    if autoregister:
        metadata["ISTIO_META_AUTO_REGISTER_GROUP"] = name
    proxy["proxyMetadata"] = metadata
    istiod = f"istiod{'-' + revision if revision and revision != 'default' else ''}.{istio_namespace}.svc"
    env = {"ISTIO_INBOUND_PORTS": ",".join(str(p) for p in sorted(set(we.ports.values()))) or "*",
           "ISTIO_NAMESPACE": ns, "ISTIO_SERVICE": f"{name}.{ns}", "ISTIO_SERVICE_CIDR": "*",
           "SERVICE_ACCOUNT": we.service_account or "default", "ISTIO_LOCAL_EXCLUDE_PORTS": EXCLUDED_PORTS}
    if revision and revision != "default":
        env["CA_ADDR"] = f"{istiod}:15012"
    if internal_ip:
        env["ISTIO_SVC_IP"] = internal_ip
    return {
        "cluster.env": _env_lines(env),
        "mesh.yaml": yaml.safe_dump({"defaultConfig": proxy}, sort_keys=True),
        "root-cert.pem": root_cert,
        "istio-token": token,
        "hosts": f"{ingress_ip} {istiod}\n" if ingress_ip else "",
    }


async def _read_cluster(args: argparse.Namespace, wg: Any) -> tuple[str, str, str]:
    from kubernetes_asyncio import config

    kube = Kube(await load_api_client(args.wl_kubeconfig or getattr(args, "kubeconfig", None)
                                      or config.KUBE_CONFIG_DEFAULT_LOCATION, identity="pilotctl"))
    ns, sa = wg.metadata.namespace, wg.spec.template.service_account or "default"
    istio_ns = args.wl_istio_namespace
    cm = "istio" if args.revision in ("", "default") else f"istio-{args.revision}"
    try:
        mesh = await kube.request("GET", f"/api/v1/namespaces/{istio_ns}/configmaps/{cm}")
        root = await kube.request("GET", f"/api/v1/namespaces/{ns}/configmaps/istio-ca-root-cert")
        token = await kube.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token", body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"audiences": ["istio-ca"], "expirationSeconds": args.tokenDuration}})
    except ApiError as e:
        raise CtlError(f"reading the cluster: {e}") from None
    finally:
        await kube.close()
    return ((mesh.get("data") or {}).get("mesh", ""), (root.get("data") or {}).get("root-cert.pem", ""),
            (token.get("status") or {}).get("token", ""))


def run(args: argparse.Namespace, _replicas: Any = None, _warn: Any = None) -> str:
    wg = read_group(args.file)
    mesh, root, token = asyncio.run(_read_cluster(args, wg))
    if not root:
        raise CtlError(f"ConfigMap {wg.metadata.namespace}/istio-ca-root-cert has no root-cert.pem")
    files = files_for(wg, mesh, root, token, cluster_id=args.clusterID, revision=args.revision,
                      istio_namespace=args.wl_istio_namespace, ingress_ip=args.ingressIP,
                      internal_ip=args.internalIP, autoregister=args.autoregister, dns_capture=args.capture_dns)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = out / name
        path.write_text(text)
        path.chmod(0o600 if name == "istio-token" else 0o644)
    return "\n".join([*(str(out / n) for n in files),
                      f"Configuration generation into directory {out} was successful"])


def add_parser(sub: argparse._SubParsersAction) -> None:
    x = sub.add_parser("experimental", aliases=["x"], help="experimental commands (as istioctl x)")
    xsub = x.add_subparsers(dest="x_command", required=True)
    workload = xsub.add_parser("workload", help="VM workloads")
    wsub = workload.add_subparsers(dest="workload_command", required=True)
    entry = wsub.add_parser("entry", help="WorkloadEntry configuration")
    esub = entry.add_subparsers(dest="entry_command", required=True)
    p = esub.add_parser("configure", help="write the files a VM needs (cluster.env, mesh.yaml, root-cert.pem, "
                                          "istio-token, hosts) from a WorkloadGroup")
    p.add_argument("-f", "--file", required=True, help="the WorkloadGroup YAML")
    p.add_argument("-o", "--output", required=True, help="directory to write the files into")
    p.add_argument("--clusterID", required=True, help="the cluster the VM registers into")
    p.add_argument("--revision", default="", help="control plane revision")
    p.add_argument("--ingressIP", default="", help="IP of the gateway reaching istiod (written into hosts)")
    p.add_argument("--internalIP", default="", help="the VM's internal IP (ISTIO_SVC_IP)")
    p.add_argument("--autoregister", action="store_true", help="register the VM when its proxy connects")
    p.add_argument("--capture-dns", dest="capture_dns", action="store_true", default=False,
                   help="ISTIO_META_DNS_CAPTURE (DNS proxying is not built here: off by default)")
    p.add_argument("--tokenDuration", type=int, default=3600, help="seconds (default: %(default)s)")
    p.add_argument("--kubeconfig", dest="wl_kubeconfig", default=None)
    p.add_argument("-i", "--istioNamespace", dest="wl_istio_namespace", default="istio-system")
    p.set_defaults(run=run)
