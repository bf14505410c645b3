"""Envoy retry policies from Istio's (mesh default or a VirtualService's)."""

from __future__ import annotations

from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2
from google.protobuf import wrappers_pb2

from pilot.config.mesh import HttpRetryPolicy
from pilot.durations import parse_duration
from pilot.networking.protos import duration


def retry_policy(policy: HttpRetryPolicy) -> route_components_pb2.RetryPolicy | None:
    if policy.attempts <= 0:
        return None
    rp = route_components_pb2.RetryPolicy(
        retry_on=policy.retry_on,
        num_retries=wrappers_pb2.UInt32Value(value=policy.attempts),
        host_selection_retry_max_attempts=5,
        retriable_status_codes=[503],
    )
    rp.retry_host_predicate.add(name="envoy.retry_host_predicates.previous_hosts").typed_config.Pack(
        previous_hosts_pb2.PreviousHostsPredicate())
    if policy.per_try_timeout:
        rp.per_try_timeout.CopyFrom(duration(parse_duration(policy.per_try_timeout)))
    return rp
