"""`pilotctl`: istioctl-style views of the control plane and its proxies (see pilot.pilotctl.cli)."""

from pilot.pilotctl.cli import main
from pilot.pilotctl.dump import resources_of

__all__ = ["main", "resources_of"]
