"""Hostname intersection between a listener and a route, as the Gateway API spec defines it:
a wildcard `*.example.com` matches any name ending in `.example.com` (not `example.com` itself);
an absent hostname matches everything."""

from __future__ import annotations


def _covers(wildcard: str, host: str) -> bool:
    """`*.a.com` covers `b.a.com`, `c.b.a.com` and `*.b.a.com`, not `a.com`."""
    return wildcard.startswith("*.") and host.endswith(wildcard[1:]) and len(host) > len(wildcard) - 1


def intersect(listener: str | None, route_hosts: list[str]) -> list[str]:
    """The hostnames a route serves on a listener (the more specific of each matching pair).
    `["*"]` means any host; `[]` means none (the route does not attach there)."""
    if not route_hosts:
        return [listener or "*"]
    if not listener:
        return list(dict.fromkeys(route_hosts))
    out = []
    for h in route_hosts:
        if h == listener or _covers(listener, h):
            out.append(h)
        elif _covers(h, listener):
            out.append(listener)
    return list(dict.fromkeys(out))


def isolate(own: str | None, hosts: list[str], siblings: list[str | None]) -> list[str]:
    """GatewayHTTPListenerIsolation: a request is served by the most specific listener of its
    port that matches it, never by a broader one. The listeners' routes share one virtual host
    per hostname, so a broader listener's route must not contribute a hostname that falls under
    a more specific sibling (`siblings`: the hostnames of the other HTTP(S) listeners on the
    port). A hostname broader than the sibling (`*.a.com` beside `*.b.a.com`) stays: Envoy picks
    the more specific virtual host for the names under the sibling."""
    narrower = [o for o in siblings if o and o != own and (not own or _covers(own, o))]
    return [h for h in hosts if not any(o == h or _covers(o, h) for o in narrower)]


def matches(pattern: str, host: str) -> bool:
    """Whether a request for `host` (possibly itself a wildcard) falls under `pattern`."""
    return pattern == "*" or pattern == host or _covers(pattern, host)
