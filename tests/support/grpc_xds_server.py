"""A proxyless gRPC xDS-enabled server (gRFC A36), meant to run as its own process.

    GRPC_XDS_BOOTSTRAP=bootstrap.json python -m tests.support.grpc_xds_server NAME PORT

Serves ``/test.Echo/Echo`` (reply ``NAME:REQUEST``) on 0.0.0.0:PORT with
``grpc.xds_server_credentials``: grpc fetches its listener
(``server_listener_resource_name_template`` in the bootstrap, filled with ``0.0.0.0:PORT``)
and applies its RBAC filters and transport security. Until that listener arrives the
server accepts no RPCs. grpcio's xDS client is process-wide, hence the own process. Prints
``{"serving": PORT}`` once started; exits on a ``quit`` line or EOF on stdin.

Keep this module free of test-only imports: it is executed with ``-m``.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent import futures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.grpc_xds_server")
    parser.add_argument("name", help="what replies start with")
    parser.add_argument("port", type=int)
    args = parser.parse_args(argv)

    import grpc

    name = args.name.encode()

    def echo(request: bytes, context) -> bytes:
        return name + b":" + request

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), xds=True)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "test.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}),))
    # The fallback applies only when the listener names no security: plaintext.
    server.add_secure_port(f"0.0.0.0:{args.port}", grpc.xds_server_credentials(grpc.insecure_server_credentials()))
    server.start()
    sys.stdout.write(json.dumps({"serving": args.port}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        if line.strip() == "quit":
            break
    server.stop(1).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
