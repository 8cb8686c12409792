"""Fixtures of the serving tests: a pixels-in bundle, the ``[cpu,serve]`` venv that runs the real server, an
``edgecap serve`` subprocess on loopback (:class:`Served`), and small images."""

from __future__ import annotations

import io
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgecap.runtime._process import die_with_parent
from tests.runtime.bundle.helpers import pixel_bundle
from tools.edge_install import build_runtime_venv

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def served_bundle(tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pixels-in FP32 bundle whose directory name is a valid Triton model name."""
    return pixel_bundle(tiny_data, tmp_path_factory)[0]


def images(count: int, seed: int = 0) -> list[np.ndarray]:
    """``count`` small RGB arrays of different sizes (ragged: a dynamic batch mixes shapes)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (40 + 3 * i, 48 + 5 * (i % 4), 3), dtype=np.uint8) for i in range(count)]


def png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="session")
def serve_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with edgecap[cpu,serve] (nvidia-pytriton pins numpy<2, so it is not the development venv)."""
    venv = build_runtime_venv(tmp_path_factory.getbasetemp() / "serve-venv", ROOT, extra="cpu,serve")
    return venv.path


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class Served:
    """An ``edgecap serve`` subprocess on loopback and its URLs; ``env`` adds to its environment."""

    def __init__(self, venv: Path, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.http, self.grpc, self.metrics = free_ports(3)
        ports = ["--http-port", str(self.http), "--grpc-port", str(self.grpc), "--metrics-port", str(self.metrics)]
        self.log = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                [str(venv / "bin" / "edgecap"), "serve", *args, *ports],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                preexec_fn=die_with_parent(),  # a killed test run leaves no server behind
            )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"edgecap serve exited: {log.read_text()[-3000:]}"
            if self.ready() == 200:
                return
            time.sleep(0.3)
        self.stop()
        raise AssertionError(f"edgecap serve was not ready in 180 s: {log.read_text()[-3000:]}")

    def ready(self) -> int | None:
        """The status ``/v2/health/ready`` answers, None when nothing answers."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/health/ready", timeout=2) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None

    def counter(self, name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=5) as r:
            text = r.read().decode()
        return sum(float(v) for v in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M))

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()
