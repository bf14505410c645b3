"""SDS for the local Envoy on a Unix socket: secrets `default` (workload key and chain) and
`ROOTCA` (the mesh root).

Envoy opens one SotW StreamSecrets stream per SDS subscription (api_type GRPC). Per stream the
server answers when the subscribed names change and when a subscribed secret gets a new version;
an ACK or a NACK gets no answer (answering an ACK loops forever, re-sending a NACKed version
would be rejected again). Names the agent does not serve are logged and left unanswered.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from pathlib import Path

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.secret.v3 import sds_pb2_grpc
from google.protobuf import any_pb2

from pilot import logging as plog
from pilot.agent.bootstrap import ROOT_SECRET, WORKLOAD_SECRET
from pilot.agent.secrets import SecretManager, WorkloadSecret

log = plog.get("sds")

SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
SERVED = (WORKLOAD_SECRET, ROOT_SECRET)


def secret_proto(name: str, secret: WorkloadSecret) -> secret_pb2.Secret:
    if name == WORKLOAD_SECRET:
        return secret_pb2.Secret(name=name, tls_certificate=common_pb2.TlsCertificate(
            certificate_chain=base_pb2.DataSource(inline_bytes=secret.chain_pem.encode()),
            private_key=base_pb2.DataSource(inline_bytes=secret.key_pem.encode())))
    return secret_pb2.Secret(name=name, validation_context=common_pb2.CertificateValidationContext(
        trusted_ca=base_pb2.DataSource(inline_bytes=secret.root_pem.encode())))


def secret_version(name: str, secret: WorkloadSecret) -> str:
    return secret.version if name == WORKLOAD_SECRET else secret.root_version


def response(names: tuple[str, ...], secret: WorkloadSecret, nonce: str) -> discovery_pb2.DiscoveryResponse:
    resources = []
    for n in names:
        a = any_pb2.Any()
        a.Pack(secret_proto(n, secret))
        resources.append(a)
    return discovery_pb2.DiscoveryResponse(
        version_info="/".join(secret_version(n, secret) for n in names), type_url=SECRET_TYPE,
        nonce=nonce, resources=resources)


class SdsService(sds_pb2_grpc.SecretDiscoveryServiceServicer):
    def __init__(self, secrets: SecretManager) -> None:
        self.secrets = secrets
        self.streams = 0
        self.pushes = 0
        self.nacks = 0
        self._ids = itertools.count(1)

    async def StreamSecrets(self, request_iterator, context: grpc.aio.ServicerContext) -> None:
        stream_id = next(self._ids)
        self.streams += 1
        requests: asyncio.Queue = asyncio.Queue()

        async def read() -> None:
            try:
                async for req in request_iterator:
                    await requests.put(req)
            finally:
                await requests.put(None)

        reader = asyncio.create_task(read())
        names: tuple[str, ...] = ()
        sent: dict[str, str] = {}  # name -> version last sent on this stream
        nonces = itertools.count(1)
        seen = self.secrets.generation
        node = ""

        async def send() -> None:
            secret = self.secrets.current
            served = tuple(n for n in names if n in SERVED)
            if secret is None or not served:
                return
            resp = response(served, secret, f"{stream_id}-{next(nonces)}")
            await context.write(resp)
            self.pushes += 1
            for n in served:
                sent[n] = secret_version(n, secret)
            log.info("SDS: PUSH", resources=",".join(served), version=resp.version_info, stream=stream_id)

        try:
            while True:
                get = asyncio.ensure_future(requests.get())
                change = asyncio.ensure_future(self.secrets.changed(seen))
                done, _ = await asyncio.wait({get, change}, return_when=asyncio.FIRST_COMPLETED)
                for t in (get, change):
                    if t not in done:
                        t.cancel()
                if change in done:
                    seen = change.result()
                    current = self.secrets.current
                    if current is not None and any(sent.get(n) != secret_version(n, current)
                                                   for n in names if n in SERVED):
                        await send()
                if get not in done:
                    continue
                req = get.result()
                if req is None:
                    return
                if req.node.id:
                    node = req.node.id
                if req.type_url and req.type_url != SECRET_TYPE:
                    log.warning("SDS: request for another type ignored", type_url=req.type_url, node=node)
                    continue
                new_names = tuple(req.resource_names)
                if req.HasField("error_detail"):
                    self.nacks += 1
                    log.warning("SDS: Envoy rejected the secret", resources=",".join(new_names),
                                version=req.version_info, nonce=req.response_nonce,
                                error=req.error_detail.message, node=node)
                if new_names != names:
                    unknown = [n for n in new_names if n not in SERVED]
                    if unknown:
                        log.error("SDS: Envoy asked for secrets this agent does not serve (only "
                                  f"{' and '.join(SERVED)}); they stay unanswered",
                                  resources=",".join(unknown), node=node)
                    names = new_names
                    await send()
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            self.streams -= 1

    async def FetchSecrets(self, request, context: grpc.aio.ServicerContext):
        secret = self.secrets.current
        names = tuple(n for n in request.resource_names if n in SERVED)
        if secret is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no workload certificate yet")
        if not names:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"this agent serves only {' and '.join(SERVED)}, not {list(request.resource_names)}")
        return response(names, secret, "fetch")


class SdsServer:
    """The gRPC server on the Unix socket. The path stays relative, as in the bootstrap (socket paths
    are limited to ~107 bytes; a relative one does not depend on where the agent runs)."""

    def __init__(self, secrets: SecretManager, path: str) -> None:
        self.service = SdsService(secrets)
        self.path = path
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        p = Path(self.path)
        p.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(p.parent, 0o700)  # the socket hands out the workload key
        with contextlib.suppress(FileNotFoundError):
            p.unlink()  # left by an agent that did not stop cleanly
        self._server = grpc.aio.server()
        sds_pb2_grpc.add_SecretDiscoveryServiceServicer_to_server(self.service, self._server)
        self._server.add_insecure_port(f"unix:{self.path}")
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=0.2)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            Path(self.path).unlink()
