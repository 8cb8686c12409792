"""A stand-in for Triton's HTTP API on loopback: what the client does with a server's answers, without a server."""

from __future__ import annotations

import http.server
import json
import threading


class FakeTriton:
    """A loopback HTTP server that answers like Triton for one model: live, its inference statistics (``name`` listed
    while ``state`` is READY, none once unloaded, as Triton's ``GET /v2/models/stats`` does), and "unknown model"
    (404) for an inference on any model. Stops within 30 s by itself. ``test_triton_server.py`` checks the same
    answers against the real server."""

    def __init__(self, name: str, state: str) -> None:
        self.infers = 0
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def answer(self, status: int, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.startswith("/v2/health"):
                    self.answer(200, {})
                elif self.path == "/v2/models/stats":
                    loaded = [{"name": name, "version": "1"}] if state == "READY" else []
                    self.answer(200, {"model_stats": loaded})
                else:
                    self.answer(404, {"error": "no"})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                fake.infers += 1
                asked = self.path.split("/")[3]
                reason = "is not found" if asked != name else "has no available versions"
                self.answer(404, {"error": f"Request for unknown model: '{asked}' {reason}"})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.stopper = threading.Timer(30, self.server.shutdown)

    def __enter__(self) -> FakeTriton:
        self.thread.start()
        self.stopper.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopper.cancel()
        self.server.shutdown()
        self.server.server_close()
