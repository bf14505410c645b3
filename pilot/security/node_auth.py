"""Which identities a node proxy may have certificates for: istiod's NodeAuthorizer.

ztunnel runs one per node and asks the CA for the certificates of the workloads on its node, naming
them in ImpersonatedIdentity. Its service account must be one of CA_TRUSTED_NODE_ACCOUNTS, and,
as in istiod, the identity must belong to a pod running on the caller's own node: the caller's pod
(named by its bound token) is looked up, its UID and service account checked, and a pod with the
requested namespace and service account must be scheduled on the same node. A stolen ztunnel token
therefore cannot mint identities of workloads elsewhere.
"""

from __future__ import annotations

from pilot.config.core import Pod
from pilot.model.store import ConfigKey, Store
from pilot.security.authn import Caller
from pilot.security.spiffe import Identity


class ImpersonationDenied(Exception):
    pass


class NodeAuthorizer:
    def __init__(self, store: Store) -> None:
        self.store = store

    def check(self, caller: Caller, target: Identity) -> None:
        """Raise ImpersonationDenied with the reason, or return when allowed."""
        if not caller.pod_name:
            raise ImpersonationDenied(
                f"cannot tell which node {caller.account} runs on: its token names no pod "
                "(a bound service-account token is needed to request other identities)")
        entry = self.store.get(ConfigKey("Pod", caller.namespace, caller.pod_name), Pod)
        if entry is None:
            raise ImpersonationDenied(f"failed to look up pod {caller.namespace}/{caller.pod_name} of the caller")
        pod = entry.obj
        if caller.pod_uid and pod.metadata.uid and pod.metadata.uid != caller.pod_uid:
            raise ImpersonationDenied(f"pod {caller.namespace}/{caller.pod_name} found, but its UID does not match "
                                      f"({pod.metadata.uid} vs {caller.pod_uid})")
        if pod.spec.service_account_name != caller.service_account:
            raise ImpersonationDenied(f"pod {caller.namespace}/{caller.pod_name} found, but it runs as "
                                      f"{pod.spec.service_account_name}, not {caller.service_account}")
        node = pod.spec.node_name
        if node and any(p.obj.spec.node_name == node
                        and p.obj.spec.service_account_name == target.service_account
                        for p in self.store.list(Pod, target.namespace)):
            return
        raise ImpersonationDenied(f"no instances of {target.namespace}/{target.service_account} found on node "
                                  f"{node or '(unscheduled)'}")
