"""The bounded HTTP front of ``edgecap serve``: what it refuses itself, and that it forwards the rest unchanged.

The upstream here is a stdlib HTTP server on loopback that records what reaches it; the real Triton behind the
front is exercised in test_served_limits.py.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from edgecap.runtime.serving.guard import HttpGuard, HttpLimits, Refused, check_infer_header

LIMITS = HttpLimits(max_pixels=10_000, max_request_bytes=4096, max_inflight_bytes=8192)


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, bytes]] = []
    hold = threading.Event()

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        _Upstream.seen.append((self.command, self.path, body))
        _Upstream.hold.wait(10)
        reply = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    do_GET = do_POST  # noqa: N815

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def front() -> Iterator[int]:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    _Upstream.seen = []
    _Upstream.hold.set()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    guard = HttpGuard("127.0.0.1", port, upstream.server_address[1], LIMITS).start()
    yield port
    guard.stop()
    upstream.shutdown()
    upstream.server_close()


def _post(port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    connection.request("POST", path, body=body, headers=headers or {})
    reply = connection.getresponse()
    status, payload = reply.status, json.loads(reply.read() or b"{}")
    connection.close()
    return status, payload


INFER = "/v2/models/m/infer"


def _pixels(shape: list[int], data: list[int]) -> bytes:
    return json.dumps({"inputs": [{"name": "pixels", "datatype": "UINT8", "shape": shape, "data": data}]}).encode()


def test_a_declared_shape_its_body_does_not_carry_is_refused_and_never_reaches_triton(front: int) -> None:
    status, reply = _post(front, INFER, _pixels([1, 100000, 100000, 3], [1, 2, 3]))
    assert status == 400 and "over this server's limit of 10000 pixels" in reply["error"]
    status, reply = _post(front, INFER, _pixels([1, 10, 10, 3], [1, 2, 3]))  # under the pixel limit, still a lie
    assert status == 400 and "declares 300 elements, 'data' holds 3" in reply["error"]
    assert _Upstream.seen == []
    good = _pixels([1, 1, 1, 3], [1, 2, 3])
    assert _post(front, INFER, good) == (200, {"ok": True})
    assert _Upstream.seen == [("POST", INFER, good)]


def test_binary_inputs_must_add_up_to_the_body(front: int) -> None:
    header = json.dumps(
        {"inputs": [{"name": "pixels", "datatype": "UINT8", "shape": [1, 2, 2, 3],
                     "parameters": {"binary_data_size": 12}}]}
    ).encode()  # fmt: skip
    headers = {"Inference-Header-Content-Length": str(len(header))}
    assert _post(front, INFER, header + bytes(12), headers)[0] == 200
    status, reply = _post(front, INFER, header + bytes(5), headers)
    assert status == 400 and "the body carries 5" in reply["error"]
    lying = header.replace(b"[1, 2, 2, 3]", b"[1, 9, 9, 3]")
    status, reply = _post(front, INFER, lying + bytes(12), {"Inference-Header-Content-Length": str(len(lying))})
    assert status == 400 and "declares 243 bytes" in reply["error"]


def test_malformed_oversized_and_compressed_bodies_get_400(front: int) -> None:
    for path in (INFER, "/v2/repository/index"):
        status, reply = _post(front, path, b'{"inputs":[{"name":"pix')
        assert status == 400 and "malformed JSON" in reply["error"], path
    status, reply = _post(front, INFER, b"x" * 5000)
    assert status == 400 and "5000 bytes is over this server's limit of 4096" in reply["error"]
    status, reply = _post(front, INFER, b"\x1f\x8b", {"Content-Encoding": "gzip"})
    assert status == 400 and "compressed" in reply["error"]
    deep = b"[" * 100_000 + b"]" * 100_000
    assert _post(front, "/v2/repository/index", deep[:4000])[0] == 400
    assert _Upstream.seen == []
    with pytest.raises(Refused, match="'shape' must be"):
        check_infer_header(b'{"inputs": [{"name": "x", "shape": [-1], "data": []}]}', 0, LIMITS)


def test_requests_past_the_bytes_in_flight_budget_are_turned_away_at_once(front: int) -> None:
    _Upstream.hold.clear()  # the upstream holds every request: their bytes stay in flight
    body = _pixels([1, 1, 1, 3], [1, 2, 3]) + b" " * 3000  # about 3.1 KB: two fit in 8 KB, a third does not
    results: list[int] = []
    held = [threading.Thread(target=lambda: results.append(_post(front, INFER, body)[0])) for _ in range(2)]
    for thread in held:
        thread.start()
    for _ in range(200):
        if len(_Upstream.seen) == 2:
            break
        threading.Event().wait(0.02)
    status, reply = _post(front, INFER, body)
    assert status == 503 and "in flight" in reply["error"]
    _Upstream.hold.set()
    for thread in held:
        thread.join(20)
    assert results == [200, 200]
    assert _post(front, INFER, body)[0] == 200  # the budget came back


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="must not exceed"):
        HttpLimits(max_request_bytes=2, max_inflight_bytes=1)
    with pytest.raises(ValueError, match="positive"):
        HttpLimits(max_pixels=0)
