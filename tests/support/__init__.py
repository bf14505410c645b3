"""Reusable helpers for tests: real Envoy processes, backends, and condition waits."""
