"""Compile the Istio-only .proto files under protos/ into pilot/gen with grpcio-tools.

Each file is compiled under exactly one include root (this directory), so its import path and
descriptor name match upstream (`istio/v1/auth/ca.proto` -> `pilot.gen.istio.v1.auth.ca_pb2`
imported as `istio.v1.auth.ca_pb2` through pilot/gen on sys.path). envoy/google/xds/udpa/validate
protos come from xds-protos and are never generated here (duplicate-symbol errors otherwise).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
OUT = ROOT.parent / "pilot" / "gen"


def main() -> int:
    from grpc_tools import protoc

    sources = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.proto"))
    if not sources:
        print("no .proto files under protos/: nothing to generate")
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    import grpc_tools

    well_known = str(Path(grpc_tools.__file__).parent / "_proto")
    args = ["protoc", f"-I{ROOT}", f"-I{well_known}", f"--python_out={OUT}", f"--pyi_out={OUT}",
            f"--grpc_python_out={OUT}", *sources]
    rc = protoc.main(args)
    if rc != 0:
        print(f"protoc failed with exit code {rc}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
