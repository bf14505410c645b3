"""pilot: an istiod-compatible service-mesh control plane."""

__version__ = "0.1.0"
