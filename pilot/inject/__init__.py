"""The sidecar injector (istiod's pkg/kube/inject): a pure core that turns an AdmissionReview for
a Pod into a JSONPatch adding istio-proxy, istio-init and their volumes, and an aiohttp handler.

- annotations.py  the annotations honoured (the table docs/injection.md is generated from)
- selection.py    webhook selectors and istiod's injectRequired
- config.py       the istio-sidecar-injector ConfigMap (config + values), last good kept
- template.py     Jinja2 rendering of a template into a Pod fragment
- probes.py       app probes rewritten to the agent
- pod.py          merge + post-processing of one pod
- review.py       AdmissionReview in, AdmissionReview out (no HTTP framework)
- handler.py      aiohttp handler for POST /inject
- patch.py        the RFC 6902 diff
- store.py        wiring: Namespace labels and the ConfigMap from the Store
- deploy.py       the deploy/ manifests generated from the above
"""

from pilot.inject.config import InjectorConfig, InjectorConfigHolder, default_config
from pilot.inject.review import InjectionContext, review

__all__ = ["InjectionContext", "InjectorConfig", "InjectorConfigHolder", "default_config", "review"]
