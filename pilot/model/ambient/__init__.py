"""Ambient mode: what ztunnel is sent (WDS workloads and services, L4 authorization) and waypoints."""
