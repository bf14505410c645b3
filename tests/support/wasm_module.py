"""A minimal proxy-wasm (ABI 0.2.0) module, assembled byte by byte: no Rust wasm32 target or
proxy-wasm SDK is installed here, and a module this small needs neither.

The module adds one response header (`name: value`) to every HTTP response it sees. It exports
what Envoy's Wasm host requires (memory, `malloc` / `proxy_on_memory_allocate`, the ABI version
marker) and the lifecycle callbacks it calls (context creation, VM start, configure)."""

from __future__ import annotations

RESPONSE_HEADERS = 2  # proxy-wasm MapType HttpResponseHeaders
I32 = 0x7F


def _uleb(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _sleb(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        done = (n == 0 and not byte & 0x40) or (n == -1 and byte & 0x40)
        out.append(byte | (0 if done else 0x80))
        if done:
            return bytes(out)


def _vec(items: list[bytes]) -> bytes:
    return _uleb(len(items)) + b"".join(items)


def _name(s: str) -> bytes:
    return _uleb(len(s)) + s.encode()


def _section(sid: int, body: bytes) -> bytes:
    return bytes([sid]) + _uleb(len(body)) + body


def _functype(params: int, results: int) -> bytes:
    return b"\x60" + _vec([bytes([I32])] * params) + _vec([bytes([I32])] * results)


def _const(n: int) -> bytes:
    return b"\x41" + _sleb(n)


def _body(code: bytes) -> bytes:
    body = b"\x00" + code + b"\x0b"  # no locals besides the parameters; `end`
    return _uleb(len(body)) + body


def add_response_header_module(name: str, value: str) -> bytes:
    name_at, value_at, heap_at = 16, 16 + len(name) + 16, 4096
    assert value_at + len(value) < heap_at
    types = [_functype(1, 1), _functype(3, 1), _functype(5, 1), _functype(0, 0), _functype(2, 0),
             _functype(2, 1)]
    imports = [_name("env") + _name("proxy_add_header_map_value") + b"\x00" + _uleb(2)]  # func 0
    # Defined functions (indices from 1): malloc, on_response_headers, abi marker, on_context_create,
    # on_vm_start, on_configure.
    funcs = [_uleb(0), _uleb(1), _uleb(3), _uleb(4), _uleb(5), _uleb(5)]
    memory = [b"\x00" + _uleb(16)]  # 16 pages (1 MiB), no maximum
    heap = [bytes([I32, 0x01]) + _const(heap_at) + b"\x0b"]  # mutable bump pointer
    exports = [_name("memory") + b"\x02" + _uleb(0)]
    for export, index in (("malloc", 1), ("proxy_on_memory_allocate", 1), ("proxy_on_response_headers", 2),
                          ("proxy_abi_version_0_2_0", 3), ("proxy_on_context_create", 4),
                          ("proxy_on_vm_start", 5), ("proxy_on_configure", 6)):
        exports.append(_name(export) + b"\x00" + _uleb(index))
    # malloc(size): return the bump pointer, advanced by size rounded up to 8.
    malloc = (b"\x23\x00" + b"\x23\x00" + b"\x20\x00" + _const(7) + b"\x6a" + _const(-8) + b"\x71"
              + b"\x6a" + b"\x24\x00")
    on_headers = (_const(RESPONSE_HEADERS) + _const(name_at) + _const(len(name)) + _const(value_at)
                  + _const(len(value)) + b"\x10\x00" + b"\x1a" + _const(0))  # call, drop, Continue
    code = [_body(malloc), _body(on_headers), _body(b""), _body(b""), _body(_const(1)), _body(_const(1))]
    data = [b"\x00" + _const(name_at) + b"\x0b" + _name(name),  # active segments in memory 0
            b"\x00" + _const(value_at) + b"\x0b" + _name(value)]
    return (b"\x00asm\x01\x00\x00\x00"
            + _section(1, _vec(types)) + _section(2, _vec(imports)) + _section(3, _vec(funcs))
            + _section(5, _vec(memory)) + _section(6, _vec(heap)) + _section(7, _vec(exports))
            + _section(10, _vec(code)) + _section(11, _vec(data)))
