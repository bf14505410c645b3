"""A gateway Envoy the way gateways really run: under pilot-agent, with a workload certificate
from the control plane's CA and ADS over the secure port (15012). Only such a router has a
proven identity, so only it is served credentials (private keys) over SDS.

The control plane must run with `secure_grpc=True` and trust `issuer` (env JWT_RULE), which
signs the service-account token the agent presents for its certificate.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.agent import PilotAgent
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.wait import wait_for
from tests.unit.test_authn import Issuer


async def start_verified_router(cp: ControlPlane, workdir: Path, issuer: Issuer, *, namespace: str,
                                service_account: str, pod: str, labels: dict[str, str],
                                delta: bool = False, root_cert: str | None = None) -> tuple[PilotAgent, Envoy]:
    """Start it and wait until it is ready; returns the agent (stop it) and a view of its Envoy.
    `root_cert`: the CA root (PEM) when it is not the file-mode one (Kubernetes mode)."""
    agent = PilotAgent(workdir, proxy_type="router", env={
        "POD_NAME": pod, "POD_NAMESPACE": namespace, "SERVICE_ACCOUNT": service_account,
        "INSTANCE_IP": "127.0.0.1", "ISTIO_METAJSON_LABELS": json.dumps(labels),
        "ISTIO_DELTA_XDS": "true" if delta else "false",
        "PROXY_CONFIG": json.dumps({"discoveryAddress": f"127.0.0.1:{cp.secure_port}",
                                    "proxyAdminPort": 0, "statusPort": 0, "concurrency": 1})})
    agent.write_root_cert(root_cert or cp.root_cert())
    agent.write_token(issuer.token(namespace=namespace, sa=service_account))
    await agent.start()
    try:
        await agent.wait_ready()
        port = await wait_for(lambda: agent.ports().get("admin"), 10, message=f"admin port\n{agent.log_tail()}")
    except BaseException:
        await agent.stop()
        raise
    return agent, Envoy.attached(f"127.0.0.1:{port}", log=agent.log_path)
