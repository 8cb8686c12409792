"""The HTTP front of ``edgecap serve``: each request is bounded before Triton's HTTP frontend spends memory on it.

Triton 2.51, the server the nvidia-pytriton wheel ships, sizes a JSON input's buffer from the shape the request
declares before it reads the data: ``{"shape": [1, 100000, 100000, 3], "data": [1, 2, 3]}``, 100 bytes, makes it
allocate 30 GB, and ``std::bad_alloc`` aborts the server. That version has no option that bounds it
(``--http-max-input-size`` came in later releases), and it inflates ``Content-Encoding: gzip`` bodies without a
bound. So ``edgecap serve`` binds Triton's own HTTP to loopback on a private port and listens on the public one
here: each request's headers and inference header are checked, a request over a limit is refused (400) and one over
the bytes-in-flight budget is turned away (503) before its body is read, and the rest is forwarded unchanged.

gRPC needs no such front for shapes: Triton compares the declared size with the bytes received before allocating.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import mmap
import re
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from edgecap.runtime.serving.protocol import DEFAULT_MAX_PIXELS, PIXELS

#: Most bytes of one HTTP request body (a 50 MP image as raw pixels is 150 MB).
DEFAULT_MAX_REQUEST_BYTES = 160 << 20
#: Most request-body bytes the front holds at once, over every client.
DEFAULT_MAX_INFLIGHT_BYTES = 256 << 20
#: Seconds a client may take to send a body it announced (the budget it reserved is held meanwhile).
BODY_TIMEOUT_S = 60.0

_DTYPE_BYTES = {
    "BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2,
    "UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8,
}  # fmt: skip
_INFER = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/infer$")
_HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
    "transfer-encoding", "upgrade", "host", "content-length",
}  # fmt: skip


@dataclass(frozen=True)
class HttpLimits:
    """What the HTTP front accepts (``edgecap serve --max-pixels --max-request-mb --max-inflight-mb``)."""

    max_pixels: int = DEFAULT_MAX_PIXELS
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES

    def __post_init__(self) -> None:
        for name in ("max_pixels", "max_request_bytes", "max_inflight_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.max_request_bytes > self.max_inflight_bytes:
            raise ValueError(
                f"the request limit ({self.max_request_bytes} bytes) must not exceed the bytes-in-flight budget "
                f"({self.max_inflight_bytes} bytes): such a request could never be accepted"
            )


class Refused(Exception):
    """A request the front answers itself: its HTTP status and the reason (Triton's ``{"error": ...}`` body)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _count_leaves(data: Any) -> int:
    """Elements of a JSON ``data`` array, nested or flat (iterative: no recursion limit to hit)."""
    count, stack = 0, [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        else:
            count += 1
    return count


def check_json(body: bytes) -> Any:
    """The parsed body, or :class:`Refused` (400) when it is not JSON: every v2 endpoint with a body takes JSON."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise Refused(400, f"malformed JSON request: {exc}") from None


def check_infer_header(header: bytes, binary_bytes: int, limits: HttpLimits) -> None:
    """Refuse (:class:`Refused`, 400) an inference header whose declared shapes are not what the body carries, or
    whose ``pixels`` images are over ``max_pixels``: what Triton would otherwise allocate from the shape alone."""
    request = check_json(header)
    inputs = request.get("inputs") if isinstance(request, dict) else None
    if not isinstance(inputs, list):
        raise Refused(400, "the request must be a JSON object with an 'inputs' array")
    binary_total = 0
    for item in inputs:
        if not isinstance(item, dict):
            raise Refused(400, "each of 'inputs' must be a JSON object")
        name, shape = item.get("name"), item.get("shape")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in shape
        ):
            raise Refused(400, f"input {name!r}: 'shape' must be an array of non-negative integers")
        count = math.prod(shape)
        if name == PIXELS and len(shape) == 4 and shape[1] * shape[2] > limits.max_pixels:
            raise Refused(
                400,
                f"input {PIXELS!r}: images of {shape[2]}×{shape[1]} = {shape[1] * shape[2]} pixels are over this "
                f"server's limit of {limits.max_pixels} pixels per image",
            )
        params = item.get("parameters", {})
        if not isinstance(params, dict):
            raise Refused(400, f"input {name!r}: 'parameters' must be a JSON object")
        if "binary_data_size" in params:
            size = params["binary_data_size"]
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise Refused(400, f"input {name!r}: 'binary_data_size' must be a non-negative integer")
            width = _DTYPE_BYTES.get(str(item.get("datatype")))
            if width is not None and size != count * width:
                raise Refused(
                    400, f"input {name!r}: shape {shape} declares {count * width} bytes, binary_data_size {size}"
                )
            binary_total += size
        elif "data" in item:
            held = _count_leaves(item["data"])
            if held != count:
                raise Refused(400, f"input {name!r}: shape {shape} declares {count} elements, 'data' holds {held}")
    if binary_total != binary_bytes:
        raise Refused(400, f"binary_data_size adds up to {binary_total} bytes, the body carries {binary_bytes}")


class _Budget:
    """Bytes of request bodies held at once; a request that does not fit is turned away, never queued."""

    def __init__(self, total: int) -> None:
        self.total, self.used = total, 0
        self._lock = threading.Lock()

    def take(self, size: int) -> bool:
        with self._lock:
            if self.used + size > self.total:
                return False
            self.used += size
            return True

    def give(self, size: int) -> None:
        with self._lock:
            self.used -= size


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _GuardServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._handle()

    do_POST = do_PUT = do_DELETE = do_HEAD = do_GET  # noqa: N815

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        """Quiet: Triton logs the requests it serves."""

    def _handle(self) -> None:
        guard = self.server
        try:
            length = self._body_length()
        except Refused as refused:
            self.close_connection = True  # the body, if any, is never read
            self._send(refused.status, {"Content-Type": "application/json"}, _error(str(refused)))
            return
        if not guard.budget.take(length):
            self.close_connection = True
            busy = f"server busy: {guard.budget.used} bytes of requests in flight; send the request again"
            self._send(503, {"Content-Type": "application/json"}, _error(busy))
            return
        body = _Body(length)
        try:
            self.connection.settimeout(BODY_TIMEOUT_S)
            complete = body.fill(self.rfile)
            self.connection.settimeout(None)
            if not complete:
                self.close_connection = True
                return
            try:
                if self.command == "POST" and _INFER.match(self.path.split("?", 1)[0]):
                    header_length = self._header_length(length)
                    check_infer_header(body.head(header_length), length - header_length, guard.limits)
                elif length:
                    check_json(body.head(length))  # Triton answers a malformed body on its other endpoints with 500
                status, headers, payload = guard.forward(self.command, self.path, self.headers.items(), body.view)
            except Refused as refused:
                status, headers, payload = refused.status, {"Content-Type": "application/json"}, _error(str(refused))
        except (TimeoutError, OSError):
            self.close_connection = True
            return
        finally:
            body.close()
            guard.budget.give(length)
        self._send(status, headers, payload)

    def _body_length(self) -> int:
        if self.headers.get("Transfer-Encoding"):
            raise Refused(400, "send the body with a Content-Length (chunked bodies are not accepted)")
        if self.headers.get("Content-Encoding", "identity").strip().lower() not in ("", "identity"):
            raise Refused(400, "compressed request bodies are not accepted: send the body uncompressed")
        text = self.headers.get("Content-Length", "0").strip()
        if not text.isdigit():
            raise Refused(400, f"bad Content-Length {text!r}")
        length = int(text)
        if length > self.server.limits.max_request_bytes:
            raise Refused(
                400, f"request of {length} bytes is over this server's limit of {self.server.limits.max_request_bytes}"
            )
        return length

    def _header_length(self, length: int) -> int:
        text = self.headers.get("Inference-Header-Content-Length")
        if text is None:
            return length
        if not text.strip().isdigit() or int(text) > length:
            raise Refused(400, f"bad Inference-Header-Content-Length {text!r} for a body of {length} bytes")
        return int(text)

    def _send(self, status: int, headers: dict[str, str], payload: bytes) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)


class _Body:
    """A request body in anonymous memory of its own (``mmap``), given back to the system when it is closed: bodies
    of many megabytes in the heap would stay with the process after they are freed."""

    def __init__(self, length: int) -> None:
        self._buffer = mmap.mmap(-1, max(length, 1))
        self.view = memoryview(self._buffer)[:length]

    def fill(self, stream: Any) -> bool:
        """Read the whole body from ``stream``; False when the client stopped sending first."""
        got = 0
        while got < len(self.view):
            read = stream.readinto(self.view[got:])
            if not read:
                return False
            got += read
        return True

    def head(self, length: int) -> bytes:
        return bytes(self.view[:length])

    def close(self) -> None:
        self.view.release()
        with contextlib.suppress(BufferError):
            self._buffer.close()


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


class _GuardServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], upstream: tuple[str, int], limits: HttpLimits) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)
        self.upstream, self.limits = upstream, limits
        self.budget = _Budget(limits.max_inflight_bytes)
        self._local = threading.local()

    def forward(
        self, method: str, path: str, headers: Any, body: bytes | memoryview
    ) -> tuple[int, dict[str, str], bytes]:
        """Send the request to Triton on this thread's kept-alive connection; a connection Triton closed while idle
        is opened again once. Triton unreachable: 503."""
        sent = {k: v for k, v in headers if k.lower() not in _HOP_BY_HOP}
        for attempt in range(2):
            kept_alive: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
            fresh = kept_alive is None
            connection = kept_alive or http.client.HTTPConnection(*self.upstream, timeout=None)
            self._local.connection = connection
            try:
                connection.request(method, path, body=body, headers=sent)
                reply = connection.getresponse()
                payload = reply.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                connection.close()
                self._local.connection = None
                if fresh or attempt:
                    raise Refused(503, f"the server is unavailable: {exc}") from None
                continue
            except OSError as exc:
                connection.close()
                self._local.connection = None
                raise Refused(503, f"the server is unavailable: {exc}") from None
            kept = {k: v for k, v in reply.getheaders() if k.lower() not in _HOP_BY_HOP}
            return reply.status, kept, payload
        raise AssertionError("unreachable")


class HttpGuard:
    """The bounded HTTP front: listens on ``host:port`` and forwards to Triton's HTTP on ``127.0.0.1:upstream_port``.

    :meth:`start` binds at once (a port in use fails there) and serves from a daemon thread; :meth:`stop` ends it.
    """

    def __init__(self, host: str, port: int, upstream_port: int, limits: HttpLimits) -> None:
        self.address, self.upstream_port, self.limits = (host, port), upstream_port, limits
        self._server: _GuardServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> HttpGuard:
        self._server = _GuardServer(self.address, ("127.0.0.1", self.upstream_port), self.limits)
        self._thread = threading.Thread(target=self._server.serve_forever, name="edgecap-http-guard", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
