"""pilot-agent: the proxy-side helper (istio-agent's role) — workload certificate from the CA served
to Envoy over SDS, the Envoy bootstrap, and Envoy's supervision."""
