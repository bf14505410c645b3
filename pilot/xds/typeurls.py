"""xDS type URLs, and the order a push sends them in (clusters before the endpoints they use,
listeners before their routes), as Envoy's own ADS client expects."""

CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ENDPOINT = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
SECRET = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
# ECDS: filter configurations HTTP filters name through config_discovery (WasmPlugins, EnvoyFilter
# EXTENSION_CONFIG), requested by name once a listener refers to them.
EXTENSION_CONFIG = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"
# BDS: the Envoy bootstrap, asked once by pilot-agent before it starts Envoy (BOOTSTRAP_XDS_AGENT),
# with EnvoyFilter `applyTo: BOOTSTRAP` patches merged (pilot/xds/generators/bootstrap.py).
BOOTSTRAP = "type.googleapis.com/envoy.config.bootstrap.v3.Bootstrap"
# The node metadata key of that request holding the bootstrap the agent wrote (JSON), which the
# patches are merged into: pilot-agent's own, not one the control plane would guess.
AGENT_BOOTSTRAP_METADATA = "AGENT_BOOTSTRAP"
# ztunnel's two types (ambient mode), served over delta only.
ADDRESS = "type.googleapis.com/istio.workload.Address"
AUTHORIZATION = "type.googleapis.com/istio.security.Authorization"
AMBIENT_TYPES = (ADDRESS, AUTHORIZATION)

PUSH_ORDER = (CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET, EXTENSION_CONFIG, ADDRESS, AUTHORIZATION, BOOTSTRAP)

SHORT = {CLUSTER: "cds", ENDPOINT: "eds", LISTENER: "lds", ROUTE: "rds", SECRET: "sds", EXTENSION_CONFIG: "ecds", ADDRESS: "wds",
         AUTHORIZATION: "wads", BOOTSTRAP: "bds"}
# For SotW these are "all or nothing": omitting a resource from a response deletes it.
STATE_OF_THE_WORLD_COMPLETE = {CLUSTER, LISTENER}

# The agent's readiness reports (istiod's v3.HealthInfoType): requests only, never served.
HEALTH = "istio.io/health"
