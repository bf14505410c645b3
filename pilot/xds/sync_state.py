"""One type's sync state, in istioctl proxy-status's words, from what a stream record holds:
the nonce last sent, the nonce last ACKed, and the nonce of the NACK still standing. The server's
ControlZ page (a live stream) and pilotctl (a replica's /debug/syncz row) both ask it, so the two
can never disagree on what SYNCED, STALE or NACKED means."""

from __future__ import annotations


def sync_state(sent: str | None, acked: str | None, nacked: str | None) -> str:
    if not sent:
        return "NOT SENT"
    if nacked and nacked == sent:
        return "NACKED"  # the proxy refused the very response it was last sent
    return "SYNCED" if sent == acked else "STALE"
