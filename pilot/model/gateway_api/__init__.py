"""Gateway API (gateway.networking.k8s.io) as this control plane serves it: translated into the
networking.istio.io Gateways and VirtualServices the gateway builders already consume, with the
status of every object computed in the same pass.

`translate` (the pass), `listeners` (Gateways and their listeners), `attach` (routes to
listeners), `http` (HTTPRoute/GRPCRoute rules), `references` (ReferenceGrant, backendRefs),
`hostnames`, `internal` (the generated objects), `conditions` (status shapes and stamping).
"""

from __future__ import annotations

from pilot.model.gateway_api.translate import EMPTY, GatewayApiResult, translate

__all__ = ["EMPTY", "GatewayApiResult", "translate"]
