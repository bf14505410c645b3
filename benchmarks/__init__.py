"""Measurement harness for the control plane: a load generator of simulated Envoy sidecars (its
own process), the server under test (its own process), a bare grpc.aio floor server (its own
process), and scenarios that drive them and write JSON results. See `python -m benchmarks -h`."""
