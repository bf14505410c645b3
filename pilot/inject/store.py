"""Wiring the injector to the Store (pilot/model/store.py): Namespace labels for selection, and
the `istio-sidecar-injector` ConfigMap applied to an InjectorConfigHolder as it changes (a bad
edit is logged and the last good configuration keeps serving; deleting the ConfigMap keeps the
last one too, as istiod keeps its in-memory configuration)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pilot.inject.config import CONFIGMAP_NAME, InjectorConfigHolder
from pilot.model.store import ConfigKey, Event, Store


def namespace_labels(store: Store) -> Callable[[str], Mapping[str, str] | None]:
    def labels(name: str) -> Mapping[str, str] | None:
        entry = store.get(ConfigKey("Namespace", "", name))
        return dict(entry.obj.metadata.labels) if entry is not None else None

    return labels


def configmap_name(revision: str) -> str:
    return CONFIGMAP_NAME if revision in ("", "default") else f"{CONFIGMAP_NAME}-{revision}"


def follow_configmap(
    store: Store, holder: InjectorConfigHolder, *, namespace: str = "istio-system", revision: str = "default"
) -> None:
    """Apply the ConfigMap now (when present) and on every change."""
    key = ConfigKey("ConfigMap", namespace, configmap_name(revision))

    def apply(entry) -> None:
        holder.update_from_configmap(getattr(entry.obj, "data", {}) or {})

    current = store.get(key)
    if current is not None:
        apply(current)

    def on_events(events: list[Event]) -> None:
        for ev in events:
            if ev.key == key and ev.new is not None:
                apply(ev.new)

    store.subscribe(on_events)
