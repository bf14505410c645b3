"""The certificate authority, its gRPC service and the authenticators (see docs/architecture.md)."""
