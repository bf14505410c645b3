"""Client-side mutual TLS decisions: which outbound clusters speak Istio mTLS, and to whom.

istiod's rules, for a client proxy that has a mesh identity (its certificates come from pilot-agent):
- a DestinationRule `tls.mode` of the cluster wins: ISTIO_MUTUAL always uses mesh mTLS; DISABLE,
  SIMPLE and MUTUAL are the user's own choice and are left alone;
- otherwise, with `enableAutoMtls` (the default), mTLS goes exactly to the endpoints that run a
  sidecar (pod label `security.istio.io/tlsMode: istio`), and plaintext to the rest, unless the
  destination's PeerAuthentication disables mTLS for the whole namespace or mesh;
- the server must present one of the destination's SPIFFE identities (its workloads' service
  accounts, or a ServiceEntry's subjectAltNames).
A proxy without a mesh identity (connected on plaintext 15010) gets none of this: it has no
certificate to present.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MeshTls:
    auto: bool  # True: per endpoint, by its tlsMode metadata; False: every connection
    sans: tuple[str, ...]  # SPIFFE identities the server may present (empty: any from the mesh root)


def spiffe_id(trust_domain: str, namespace: str, service_account: str) -> str:
    return f"spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}"


def client_mesh_tls(*, dr_tls_mode: str | None, auto_mtls: bool, eds_cluster: bool,
                    destination_mtls_disabled: bool, sans: tuple[str, ...],
                    dr_sans: tuple[str, ...] = ()) -> MeshTls | None:
    """What one outbound cluster does for a client with a mesh identity (callers skip the rest).
    `dr_tls_mode`: the DestinationRule's tls.mode in force for this cluster (port/subset merged),
    None when it sets none."""
    if dr_tls_mode == "ISTIO_MUTUAL":
        return MeshTls(False, dr_sans or sans)
    if dr_tls_mode is not None:
        return None
    if not auto_mtls or not eds_cluster or destination_mtls_disabled:
        return None
    return MeshTls(True, sans)
