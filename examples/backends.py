"""The example mesh's backends: tiny HTTP and TCP servers on the ports its EndpointSlices name.

    python examples/backends.py

Each HTTP backend answers with its own name, so you can see which service Envoy routed to.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

HTTP_BACKENDS = {"reviews": 19081, "ratings": 19082}
TCP_ECHO = ("database", 19083)


async def http_backend(name: str, port: int) -> web.AppRunner:
    async def handle(request: web.Request) -> web.Response:
        body = {"service": name, "path": request.path, "host": request.headers.get("Host", "")}
        return web.Response(text=json.dumps(body) + "\n", content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def tcp_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(f"{TCP_ECHO[0]}: ".encode())
    while data := await reader.read(4096):
        writer.write(data)
        await writer.drain()
    writer.close()


async def main() -> None:
    for name, port in HTTP_BACKENDS.items():
        await http_backend(name, port)
        print(f"{name}: http://127.0.0.1:{port}/")
    server = await asyncio.start_server(tcp_echo, "127.0.0.1", TCP_ECHO[1])
    print(f"{TCP_ECHO[0]}: tcp 127.0.0.1:{TCP_ECHO[1]} (echo)")
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
