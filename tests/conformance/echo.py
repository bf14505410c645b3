"""Local stand-ins for the upstream conformance backends (echo-basic): one HTTP server per
Deployment of the vendored manifests, answering as echo-basic does so the upstream expectations
can be checked unchanged: JSON with the request's path, host, method, proto and headers (name ->
list of values) and the serving pod's namespace, service and pod name. Like echo-basic,
`X-Echo-Set-Header: name:value,...` sets response headers, `?delay=1s` answers late, and
`/status/NNN` answers with that status.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
from dataclasses import dataclass, field

from aiohttp import web

_STATUS_PATH = re.compile(r"^/status/(\d\d\d)$")


def _seconds(duration: str) -> float:
    """Go duration strings as echo-basic's `delay` takes them (`1s`, `500ms`)."""
    m = re.fullmatch(r"([0-9.]+)(ms|s|m)?", duration)
    if m is None:
        raise ValueError(duration)
    return float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}[m.group(2)]


@dataclass
class EchoServer:
    namespace: str
    deployment: str
    service: str = ""
    tls: ssl.SSLContext | None = None
    requests: list[dict] = field(default_factory=list)  # what it was sent (mirroring checks)
    port: int = 0
    _runner: web.AppRunner | None = None

    @property
    def pod(self) -> str:
        # echo-basic reports POD_NAME; Deployment pods are named DEPLOYMENT-<hash>-<suffix>.
        return f"{self.deployment}-5f7d8c9b4-local"

    async def _handle(self, request: web.Request) -> web.Response:
        headers: dict[str, list[str]] = {}
        for name, value in request.headers.items():
            if name.lower() != "host":  # Go's Request.Header leaves Host out; echo-basic too
                headers.setdefault(name, []).append(value)
        info = {"path": request.raw_path, "host": request.host,
                "method": request.method, "proto": f"HTTP/{request.version.major}.{request.version.minor}",
                "headers": headers, "namespace": self.namespace, "ingress": "", "service": self.service,
                "pod": self.pod}
        ssl_obj = request.transport.get_extra_info("ssl_object") if request.transport is not None else None
        if ssl_obj is not None:  # echo-basic reports the SNI a TLS client sent it
            info["tls"] = {"serverName": getattr(ssl_obj, "sni", "")}
        self.requests.append(info)
        m = _STATUS_PATH.match(request.path)
        if m is not None:
            return web.Response(status=int(m.group(1)))
        delay = request.query.get("delay")
        if delay:
            await asyncio.sleep(min(_seconds(delay), 30))
        response = web.Response(text=json.dumps(info), content_type="application/json")
        for kv_list in request.headers.getall("X-Echo-Set-Header", []):
            for kv in kv_list.split(","):
                name, sep, value = kv.partition(":")
                if sep and name.strip():
                    response.headers.add(name.strip(), value.strip())
        return response

    async def start(self) -> EchoServer:
        if self.tls is not None:
            # Python's server side does not expose the client's SNI: keep it from the callback.
            def remember_sni(sslobj, name, _ctx):
                sslobj.sni = name or ""
            self.tls.sni_callback = remember_sni
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.tls)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


# --- gRPC: echo-basic's GrpcEcho service (conformance/echo-basic/grpcecho.proto), its messages
# declared here by descriptor so no generated code is needed. Only what the tests read is kept.
GRPC_SERVICE = "gateway_api_conformance.echo_basic.grpcecho.GrpcEcho"


def _grpc_messages():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    f = descriptor_pb2.FileDescriptorProto(name="conformance_grpcecho.proto",
                                           package="gateway_api_conformance.echo_basic.grpcecho", syntax="proto3")
    string, message = descriptor_pb2.FieldDescriptorProto.TYPE_STRING, descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
    optional, repeated = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED

    def msg(name, *fields):
        m = f.message_type.add(name=name)
        for number, (fname, ftype, label, tname) in enumerate(fields, 1):
            fd = m.field.add(name=fname, number=number, type=ftype, label=label)
            if tname:
                fd.type_name = tname

    pkg = ".gateway_api_conformance.echo_basic.grpcecho."
    msg("Header", ("key", string, optional, ""), ("value", string, optional, ""))
    msg("Context", ("namespace", string, optional, ""), ("ingress", string, optional, ""),
        ("service_name", string, optional, ""), ("pod", string, optional, ""))
    msg("Assertions", ("fully_qualified_method", string, optional, ""), ("headers", message, repeated, pkg + "Header"),
        ("authority", string, optional, ""), ("context", message, optional, pkg + "Context"))
    msg("EchoRequest")
    msg("EchoResponse", ("assertions", message, optional, pkg + "Assertions"),
        ("request", message, optional, pkg + "EchoRequest"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName(pkg[1:] + "EchoRequest")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName(pkg[1:] + "EchoResponse")))


EchoRequest, EchoResponse = _grpc_messages()


@dataclass
class GrpcEchoServer:
    """echo-basic with GRPC_ECHO_SERVER set: Echo and EchoTwo answer with what they were sent and
    who answered; EchoThree is left unimplemented, as upstream's is."""

    namespace: str
    deployment: str
    service: str = ""
    requests: list[dict] = field(default_factory=list)
    port: int = 0
    _server: object = None

    @property
    def pod(self) -> str:
        return f"{self.deployment}-5f7d8c9b4-local"

    async def start(self) -> GrpcEchoServer:
        import grpc

        def handler(method: str):
            async def echo(request, context):
                md = [(k, v) for k, v in context.invocation_metadata()]
                self.requests.append({"method": method, "metadata": md})
                authority = dict(md).get(":authority", "")
                a = {"fully_qualified_method": f"/{GRPC_SERVICE}/{method}", "authority": authority,
                     "headers": [{"key": k, "value": v} for k, v in md if isinstance(v, str)],
                     "context": {"namespace": self.namespace, "service_name": self.service, "pod": self.pod}}
                return EchoResponse(assertions=a)
            return grpc.unary_unary_rpc_method_handler(echo, request_deserializer=EchoRequest.FromString,
                                                       response_serializer=EchoResponse.SerializeToString)

        server = grpc.aio.server()
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            GRPC_SERVICE, {"Echo": handler("Echo"), "EchoTwo": handler("EchoTwo")})])
        self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._server = server
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None


@dataclass
class TcpEchoServer:
    """echo-basic with TCP_ECHO_SERVER set: a plain listener (targetPort 3000) and a TLS one (8443).
    It greets, answers PING with PONG, IS_TLS with whether the connection is TLS, and TEST with
    JSON naming the pod, its namespace and the SNI it was sent."""

    namespace: str
    deployment: str
    tls: ssl.SSLContext | None = None
    service: str = ""
    requests: list[dict] = field(default_factory=list)
    port: int = 0  # the plain listener
    tls_port: int = 0
    _servers: list = field(default_factory=list)

    WELCOME = b"Gateway API Test TCP Server\n"

    @property
    def pod(self) -> str:
        return f"{self.deployment}-5f7d8c9b4-local"

    def port_for(self, target_port: int) -> int:
        return self.tls_port if target_port == 8443 and self.tls_port else self.port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ssl_obj = writer.get_extra_info("ssl_object")
        writer.write(self.WELCOME)
        try:
            while line := await reader.readline():
                cmd = line.strip().decode()
                if cmd == "PING":
                    writer.write(b"PONG\n")
                elif cmd == "IS_TLS":
                    writer.write(b"true\n" if ssl_obj is not None else b"false\n")
                elif cmd == "TEST":
                    out = {"namespace": self.namespace, "service": self.service, "pod": self.pod,
                           "isTLS": ssl_obj is not None}
                    if ssl_obj is not None:
                        out["tls"] = {"serverName": ssl_obj.server_hostname or getattr(ssl_obj, "sni", "") or ""}
                    writer.write(json.dumps(out).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def start(self) -> TcpEchoServer:
        plain = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = plain.sockets[0].getsockname()[1]
        self._servers.append(plain)
        if self.tls is not None:
            # Python's server side does not expose the client's SNI: keep it from the callback.
            def remember_sni(sslobj, name, _ctx):
                sslobj.sni = name or ""
            self.tls.sni_callback = remember_sni
            secure = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.tls)
            self.tls_port = secure.sockets[0].getsockname()[1]
            self._servers.append(secure)
        return self

    async def stop(self) -> None:
        for s in self._servers:
            s.close()
        self._servers.clear()
