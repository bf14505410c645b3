"""Free TCP ports on the loopback interface.

There is an unavoidable race between closing the probe socket and the real
user binding the port; prefer letting the server bind port 0 and reading the
real port back whenever the server supports it.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """Return ``n`` distinct free ports.

    All probe sockets stay open until every port is chosen, so the kernel
    cannot hand the same port out twice.
    """
    sockets: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
