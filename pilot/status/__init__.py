"""Gateway API status at the edges: what the last push computed, with its transition times
(`view`), for /debug/gatewayz in every mode, and written to the apiserver by the leader in
Kubernetes mode (sources/kube/status_writer.py)."""
