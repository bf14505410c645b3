"""The README's pilot-agent walkthrough, step by step, with the same commands (as console-script
shims onto this checkout): file mode, a token from `pilotctl jwt`, the root the file-mode CA
wrote, `pilot-agent proxy sidecar`, and `pilotctl pc secrets` showing what the Envoy holds.
Only the ports differ (free ones instead of the defaults, passed with the documented flags), so
the test cannot collide with anything else on the machine."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import urllib.request
from pathlib import Path

import pytest
from cryptography import x509

from tests.support.control_plane import REPO_ROOT
from tests.support.ports import free_ports
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(120)
README = REPO_ROOT / "README.md"


def walkthrough() -> str:
    text = README.read_text()
    m = re.search(r"<!-- agent-walkthrough -->\n```sh\n(.*?)```", text, re.DOTALL)
    assert m, "README lost its marked pilot-agent walkthrough"
    return m.group(1)


def shims(directory: Path) -> dict[str, str]:
    """`pilotctl`, `pilot-discovery`, `pilot-agent` on PATH, running this checkout."""
    directory.mkdir()
    for name, module in (("pilotctl", "pilot.pilotctl"), ("pilot-discovery", "pilot.cli"),
                         ("pilot-agent", "pilot.agent")):
        p = directory / name
        p.write_text(f"#!/bin/sh\nexec {sys.executable} -m {module} \"$@\"\n")
        p.chmod(0o755)
    return {**os.environ, "PATH": f"{directory}:{os.environ['PATH']}", "PYTHONPATH": str(REPO_ROOT)}


async def sh(script: str, env: dict, cwd: Path) -> str:
    proc = await asyncio.create_subprocess_exec("bash", "-euo", "pipefail", "-c", script, env=env, cwd=str(cwd),
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, f"{script}\n{err.decode()}"
    return out.decode()


def _json(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except OSError as e:
        return getattr(e, "code", 0)


async def test_readme_walkthrough_runs_as_written(tmp_path):
    steps = walkthrough()
    # The commands this test runs are the README's.
    for command in ("pilotctl jwt init ./issuer", 'JWT_RULE="$(pilotctl jwt rule ./issuer)" pilot-discovery discovery',
                    "cp /tmp/mesh/etc/cacerts-self-signed/root-cert.pem var/run/secrets/istio/root-cert.pem",
                    "pilotctl jwt token /tmp/mesh/issuer --namespace shop --sa cart > var/run/secrets/tokens/istio-token",
                    "pilot-agent proxy sidecar", "curl 127.0.0.1:15020/healthz/ready", "pilotctl pc secrets cart-1.shop"):
        assert command in steps, command
    env = shims(tmp_path / "bin")
    mesh, pod = tmp_path / "mesh", tmp_path / "pod"
    grpc, secure, http, monitoring, https, admin, status = free_ports(7)
    ports = (f"--grpcAddr 127.0.0.1:{grpc} --secureGRPCAddr 127.0.0.1:{secure} --httpAddr 127.0.0.1:{http} "
             f"--monitoringAddr 127.0.0.1:{monitoring} --httpsAddr 127.0.0.1:{https}")
    procs = []
    try:
        # 1. the control plane trusting a local test issuer.
        (mesh / "config").mkdir(parents=True)
        await sh("pilotctl jwt init ./issuer", env, mesh)
        log = open(mesh / "discovery.log", "wb")  # noqa: SIM115, ASYNC230 - lives as long as the process
        procs.append(await asyncio.create_subprocess_exec(
            "bash", "-c", f'JWT_RULE="$(pilotctl jwt rule ./issuer)" exec pilot-discovery discovery '
                          f"--configDir ./config {ports}", env=env, cwd=str(mesh), stdout=log, stderr=log))
        root = mesh / "etc/cacerts-self-signed/root-cert.pem"
        await wait_for(lambda: root.exists() and http_status(f"http://127.0.0.1:{monitoring}/ready") == 200, 60,
                       message=f"control plane ready\n{(mesh / 'discovery.log').read_text()[-3000:]}")
        # 2. the pod's files.
        pod.mkdir()
        await sh(f"mkdir -p var/run/secrets/istio var/run/secrets/tokens\n"
                 f"cp {root} var/run/secrets/istio/root-cert.pem\n"
                 f"pilotctl jwt token {mesh}/issuer --namespace shop --sa cart > var/run/secrets/tokens/istio-token",
                 env, pod)
        # 3. the agent and its Envoy.
        agent_env = {**env, "POD_NAME": "cart-1", "POD_NAMESPACE": "shop", "SERVICE_ACCOUNT": "cart",
                     "INSTANCE_IP": "127.0.0.1", "ISTIO_META_INTERCEPTION_MODE": "NONE",
                     "TERMINATION_DRAIN_DURATION_SECONDS": "0",
                     "PROXY_CONFIG": json.dumps({"discoveryAddress": f"127.0.0.1:{secure}",
                                                 "proxyAdminPort": admin, "statusPort": status})}
        alog = open(pod / "agent.log", "wb")  # noqa: SIM115, ASYNC230 - lives as long as the process
        procs.append(await asyncio.create_subprocess_exec("pilot-agent", "proxy", "sidecar", env=agent_env,
                                                          cwd=str(pod), stdout=alog, stderr=alog))
        await wait_for(lambda: http_status(f"http://127.0.0.1:{status}/healthz/ready") == 200, 60,
                       message=f"agent ready\n{(pod / 'agent.log').read_text()[-3000:]}")
        out = await sh(f"pilotctl --addr 127.0.0.1:{monitoring} pc secrets cart-1.shop", env, pod)
        rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
        assert out.splitlines()[0].split()[:5] == ["RESOURCE", "NAME", "TYPE", "STATUS", "VALID"]
        assert set(rows) == {"default", "ROOTCA"}, out
        # No listener or cluster of this empty mesh asks Envoy for either secret (its own xDS
        # connection goes through the agent's xDS proxy, as with istio-agent): the agent holds both.
        assert rows["default"][1:5] == ["Cert", "Chain", "AGENT", "true"]
        assert rows["ROOTCA"][1:4] == ["CA", "AGENT", "true"]
        held = await asyncio.to_thread(_json, f"http://127.0.0.1:{admin}/config_dump?resource=dynamic_active_secrets")
        assert not held.get("configs"), held
        assert rows["ROOTCA"][4] == format(x509.load_pem_x509_certificate(root.read_bytes()).serial_number, "x")
    finally:
        for p in reversed(procs):
            if p.returncode is None:
                p.terminate()
                await asyncio.wait_for(p.wait(), 20)
