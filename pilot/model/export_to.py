"""exportTo: whether a namespace sees an object, the one rule VirtualServices, DestinationRules
and ServiceEntries share (istiod's visibility: unset or `*` everyone, `.` the object's own
namespace, else the namespaces named)."""

from __future__ import annotations

from collections.abc import Collection


def exported_to(export: Collection[str], owner_namespace: str, namespace: str) -> bool:
    return not export or "*" in export or namespace in export or ("." in export and owner_namespace == namespace)
