"""The certificate authority, its gRPC service and the authenticators (see ARCHITECTURE.md)."""
