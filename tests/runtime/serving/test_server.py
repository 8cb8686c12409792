"""``TritonServer`` without Triton: readiness must come from this server, not from whatever answers on its port."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from edgecap.runtime.serving.server import Endpoints, ServerError, TritonServer
from tests.runtime.serving.conftest import free_ports


class Impostor(BaseHTTPRequestHandler):
    """Another server on the port: ready, under its own name."""

    name = "someone-else"

    def do_GET(self) -> None:
        body = json.dumps({"name": self.name}).encode() if self.path == "/v2" else b""
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def impostor() -> Iterator[int]:
    port = free_ports(1)[0]
    server = ThreadingHTTPServer(("127.0.0.1", port), Impostor)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield port
    server.shutdown()
    server.server_close()


def test_another_server_answering_ready_is_not_this_one(impostor: int, tmp_path: Path) -> None:
    server = TritonServer(tmp_path, tmp_path, Endpoints("127.0.0.1", impostor, 1, 2))
    server.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(ServerError, match="not ready after 2 s"):
            server.wait_ready(timeout_s=2)
        Impostor.name = server.keys.server_id  # the same answer under this start's id is this server
        server.wait_ready(timeout_s=5)
    finally:
        Impostor.name = "someone-else"
        server.process.kill()
        server.process.wait()
