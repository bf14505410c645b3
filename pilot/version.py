"""Build information in istiod's shape (pkg/version BuildInfo): served at /version, in the
`pilot_info` and `istio_build` metrics, and in the xDS ControlPlane identifier istioctl reads.

The values describe this build: the package version, the git commit and tree state when run
from a checkout (as `make` builds do), and the interpreter in the `golang_version` slot, which
is the field istioctl shows as the runtime version.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import socket
import subprocess
from pathlib import Path

from pilot import __version__

_REPO = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str | None:
    if not (_REPO / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(_REPO), *args], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@functools.cache
def build_info() -> dict[str, str]:
    """istiod's BuildInfo JSON: version, revision, golang_version, status, tag."""
    revision = _git("rev-parse", "HEAD") or "unknown"
    status = "unknown"
    if revision != "unknown":
        dirty = _git("status", "--porcelain", "--untracked-files=no")
        status = "Modified" if dirty else "Clean"
    return {
        "version": __version__,
        "revision": revision,
        "golang_version": f"{platform.python_implementation()} {platform.python_version()}",
        "status": status,
        "tag": _git("describe", "--tags", "--exact-match") or __version__,
    }


def info_string() -> str:
    """istiod's BuildInfo.String(): version-revision-status (the `pilot_info` version label)."""
    b = build_info()
    return f"{b['version']}-{b['revision']}-{b['status']}"


def instance_id() -> str:
    """The replica's name: POD_NAME in Kubernetes (as istiod), else the host name."""
    return os.environ.get("POD_NAME") or socket.gethostname()


def control_plane_identifier() -> str:
    """istiod's IstioControlPlaneInstance JSON (Go field names: Component, ID, Info), which
    istioctl parses from DiscoveryResponse.control_plane to name the replica and its version."""
    return json.dumps({"Component": "istiod", "ID": instance_id(), "Info": build_info()})
