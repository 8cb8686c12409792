"""Start NVIDIA's Triton Inference Server over a model repository: the binary the ``nvidia-pytriton`` wheel ships.

edgecap writes no server. The ``[serve]`` extra installs ``nvidia-pytriton``, whose wheel carries ``tritonserver``
(x86-64 and aarch64), its Python backend and a backend stub per Python version; this module only locates them, lays
out a backend directory with the stub of the running interpreter, and starts the binary with the right environment:

* the stub embeds Python and must load **this interpreter's own** ``libpython`` (``sysconfig``'s ``LIBDIR`` first
  on ``LD_LIBRARY_PATH``): another ``libpython`` of the same minor version (a distribution's older 3.11.2 next to a
  3.11.7) fails model loading with ``'_thread.RLock' object has no attribute '_recursion_count'``;
* the stub finds its ``site-packages`` (edgecap, numpy, the inference engine) through ``PATH``: this environment's
  ``bin`` goes first;
* the wheel's bundled libraries (``nvidia_pytriton.libs``) complete ``LD_LIBRARY_PATH``.

Triton itself owns dynamic batching, queue limits (a full queue is refused at once with its error), health,
readiness and metrics. Stopping is edgecap's: the models are unloaded first (Triton then refuses new requests and
finishes the accepted ones), then the server and its backend stubs end (:meth:`TritonServer.stop`). The control
APIs that unload needs are locked behind a secret of each start (:mod:`edgecap.runtime.serving.lockdown`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import psutil

from edgecap.runtime._process import die_with_parent
from edgecap.runtime.serving.lockdown import Secrets, remove_shm, restricted_api_flags

#: What to install when the server binary is missing.
INSTALL_HINT = "pip install 'edgecap[serve]' (NVIDIA's Triton server binary comes in the nvidia-pytriton wheel)"


class ServerError(RuntimeError):
    """The server cannot start, or stopped: the message holds the reason and the tail of its log."""


@dataclass(frozen=True)
class TritonDistribution:
    """Where the ``nvidia-pytriton`` wheel put Triton: the binary, its backends, the stubs and its libraries."""

    binary: Path
    backends: Path
    stub: Path
    libraries: Path

    @classmethod
    def find(cls) -> TritonDistribution:
        """The installed distribution, with the backend stub of the running Python, or a :class:`ServerError`."""
        spec = importlib.util.find_spec("pytriton")  # located, never imported: its own numpy pin stays its business
        if spec is None or not spec.submodule_search_locations:
            raise ServerError(f"Triton Inference Server is not installed: {INSTALL_HINT}")
        root = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        found = cls(
            binary=root / "bin" / "tritonserver",
            backends=root / "backends",
            stub=root / "python_backend_stubs" / version / "triton_python_backend_stub",
            libraries=root.parent.parent / "nvidia_pytriton.libs",
        )
        if not found.binary.is_file() or not (found.backends / "python").is_dir():
            raise ServerError(f"no tritonserver binary under {root}: reinstall it, {INSTALL_HINT}")
        if not found.stub.is_file():
            raise ServerError(
                f"nvidia-pytriton has no Python backend stub for Python {version} under {found.stub.parent.parent}"
            )
        return found

    def backend_directory(self, dest: Path) -> Path:
        """``dest/backends``: Triton's backends, with the Python backend's stub for this interpreter (links)."""
        backends = dest / "backends"
        for source in self.backends.iterdir():
            target = backends / source.name
            target.mkdir(parents=True, exist_ok=True)
            for item in source.iterdir():
                if item.name != "triton_python_backend_stub":
                    (target / item.name).symlink_to(item)
        (backends / "python" / "triton_python_backend_stub").symlink_to(self.stub)
        return backends


def server_environment(distribution: TritonDistribution, base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: this interpreter's libpython and the wheel's libraries first, this env's ``bin`` on
    ``PATH`` (see the module docstring for why)."""
    env = dict(os.environ if base is None else base)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    library_path = [p for p in (libdir, str(distribution.libraries), env.get("LD_LIBRARY_PATH", "")) if p]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(library_path)
    env["PATH"] = os.pathsep.join([str(Path(sys.prefix) / "bin"), env.get("PATH", "")])
    return env


@dataclass(frozen=True)
class Endpoints:
    """Where the server listens. ``host`` is the address it binds (``127.0.0.1``: this machine only); ``http_host``,
    when given, is where Triton's HTTP binds instead (loopback behind ``edgecap serve``'s bounded front, guard.py)."""

    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    http_host: str | None = None

    @property
    def http_url(self) -> str:
        return f"http://{_connect_host(self.http_host or self.host)}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"grpc://{_connect_host(self.host)}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{_connect_host(self.host)}:{self.metrics_port}/metrics"


def _connect_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else host


def server_command(
    distribution: TritonDistribution,
    repository: Path,
    backends: Path,
    endpoints: Endpoints,
    *,
    exit_timeout_s: int,
    keys: Secrets,
) -> list[str]:
    """The ``tritonserver`` command line: the control APIs locked behind ``keys`` (and inference behind its token),
    the server named by ``keys.server_id``, the Python backend's shared memory named by ``keys.shm_prefix``."""
    return [
        str(distribution.binary),
        f"--model-repository={repository}",
        f"--backend-directory={backends}",
        f"--cache-directory={backends.parent / 'caches'}",
        f"--http-address={endpoints.http_host or endpoints.host}",
        f"--http-port={endpoints.http_port}",
        f"--grpc-address={endpoints.host}",
        f"--grpc-port={endpoints.grpc_port}",
        f"--metrics-address={endpoints.host}",
        f"--metrics-port={endpoints.metrics_port}",
        f"--exit-timeout-secs={exit_timeout_s}",
        "--model-control-mode=explicit",  # so a drain can unload the models: new requests refused, in flight finished
        "--load-model=*",
        *restricted_api_flags(keys),  # ...and only edgecap serve can: a client could load a model.py of its own
        f"--id={keys.server_id}",
        f"--backend-config=python,shm-region-prefix-name={keys.shm_prefix}",
        "--strict-readiness=true",
        "--exit-on-error=true",
        "--log-verbose=0",
    ]


class TritonServer:
    """A running ``tritonserver`` over ``repository``: start, wait until ready, stop (SIGTERM drains).

    Args:
        repository: a model repository (:func:`~edgecap.runtime.serving.repository.write_triton_repository`).
        workdir: where the backend directory and the server log go (must exist).
        endpoints: addresses and ports.
        exit_timeout_s: how long SIGTERM waits for requests in flight before the server gives up on them.
        token: when given, inference, metadata and statistics need the ``edgecap-token`` header with this value.
    """

    def __init__(
        self,
        repository: Path,
        workdir: Path,
        endpoints: Endpoints = Endpoints(),
        *,
        exit_timeout_s: int = 30,
        token: str | None = None,
    ) -> None:
        self.repository = Path(repository)
        self.workdir = Path(workdir)
        self.endpoints = endpoints
        self.exit_timeout_s = exit_timeout_s
        self.keys = Secrets(token=token)
        self.log_path = self.workdir / "tritonserver.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._instances: list[psutil.Process] = []

    def start(self, *, log_to_file: bool = True) -> TritonServer:
        distribution = TritonDistribution.find()
        backends = distribution.backend_directory(self.workdir)
        command = server_command(
            distribution, self.repository, backends, self.endpoints, exit_timeout_s=self.exit_timeout_s, keys=self.keys
        )
        output = open(self.log_path, "wb") if log_to_file else None  # noqa: SIM115 (the child holds it)
        try:
            self.process = subprocess.Popen(
                command,
                env=server_environment(distribution),
                stdout=output,
                stderr=subprocess.STDOUT if output else None,
                preexec_fn=die_with_parent(),  # no threads run yet here; a killed parent leaves no server behind
                start_new_session=True,  # its own process group: the backend stubs go with it (see stop)
            )
        finally:
            if output is not None:
                output.close()
        return self

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Block until ``/v2/health/ready`` answers 200 (every model loaded) **from this server** (its metadata
        name is this start's id: another server on the same port does not count), or raise with the log's tail."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise ServerError(f"tritonserver exited before it was ready{self._log_tail()}")
            try:
                self._request("/v2/health/ready", timeout_s=2)
                if json.loads(self._request("/v2", timeout_s=2)).get("name") == self.keys.server_id:
                    self._instances = self.process_children()
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.25)
        raise ServerError(f"tritonserver was not ready after {timeout_s:.0f} s{self._log_tail()}")

    def process_children(self) -> list[psutil.Process]:
        """The server's child processes: the Python backend's stubs, one per model instance."""
        if self.process is None:
            return []
        try:
            return psutil.Process(self.process.pid).children()
        except psutil.Error:
            return []

    def dead_instance(self) -> int | None:
        """The pid of a model instance process that died since the server was ready, else None. Triton keeps
        answering ready while such a model fails every request ("Stub process is not healthy")."""
        for child in self._instances:
            try:
                if child.status() != psutil.STATUS_ZOMBIE:
                    continue
            except psutil.NoSuchProcess:
                pass
            return child.pid
        return None

    def models(self) -> list[str]:
        """The models Triton's repository index lists as READY."""
        index = self._request("/v2/repository/index", timeout_s=10, post=True)
        return [m["name"] for m in json.loads(index or b"[]") if m.get("state") == "READY"]

    def drain(self, timeout_s: float | None = None) -> bool:
        """Unload every model, which makes Triton refuse new requests for it at once while the requests already
        accepted (executing or queued) finish; True when they all finished within ``timeout_s`` (default the exit
        timeout).

        Triton's own SIGTERM handling is not a drain: it waits for clients to close their keep-alive connections and
        keeps answering requests sent on them meanwhile, then gives up when its exit timeout expires."""
        deadline = time.monotonic() + (self.exit_timeout_s if timeout_s is None else timeout_s)
        try:
            names = self.models()
            for name in names:
                self._request(f"/v2/repository/models/{urllib.parse.quote(name)}/unload", timeout_s=10, post=True)
            while time.monotonic() < deadline:
                index = json.loads(self._request("/v2/repository/index", timeout_s=10, post=True) or b"[]")
                if not any(m.get("name") in names and m.get("state") in ("READY", "UNLOADING") for m in index):
                    return True
                time.sleep(0.02)  # readiness answers 200 again once the models are unloaded: stop soon after
        except (OSError, ValueError):  # the server is gone already: nothing left to drain
            return self.process is None or self.process.poll() is not None
        return False

    def stop(self, timeout_s: float | None = None) -> int:
        """Drain (:meth:`drain`), then end the server and its backend stubs and remove their shared memory; returns
        the exit status: 0 when every accepted request finished, else the server's own status (or 1 when it had to
        be killed while requests were still running)."""
        if self.process is None:
            return 0
        drained = self.process.poll() is not None or self.drain(timeout_s)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):  # no model left: it exits unless a client idles
                self.process.wait(timeout=5)
        code = self.process.poll()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)  # the server, if it still waits on idle connections, and stubs
        self.process.wait()
        remove_shm(self.keys.shm_prefix)  # a killed server and its stubs leave their regions behind
        if drained:
            return 0
        return code if code not in (None, 0) else 1

    def _request(self, path: str, *, timeout_s: float, post: bool = False) -> bytes:
        """An HTTP call with this server's secrets; raises ``OSError`` unless it answers 200."""
        url = f"{self.endpoints.http_url}{path}"
        data, method = (b"{}", "POST") if post else (None, "GET")
        request = urllib.request.Request(url, data=data, method=method, headers=self.keys.headers())
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return reply.read()

    def _log_tail(self, lines: int = 25) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return ":\n" + "\n".join(tail) if tail else ""

    def __enter__(self) -> TritonServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def serve_until_signalled(
    server: TritonServer,
    signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT),
    report: Callable[[str], None] = lambda message: None,
) -> int:
    """Run until SIGTERM/SIGINT (then drain and stop: :meth:`TritonServer.stop`), until the server exits by itself,
    or until a model instance process dies (Triton would go on answering ready for a model that fails every
    request: the server stops instead, so readiness goes with it and a supervisor restarts it; status 1);
    returns the exit status. A second signal during the drain stops at once."""
    asked = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if asked.is_set():
            raise KeyboardInterrupt
        asked.set()

    for signum in signals:
        signal.signal(signum, on_signal)
    assert server.process is not None
    dead = None
    while not asked.is_set() and server.process.poll() is None and dead is None:
        asked.wait(0.2)
        dead = server.dead_instance()
    if server.process.poll() is not None:
        return server.process.returncode
    if dead is not None:
        report(f"a model instance process (pid {dead}) died: its model fails every request, so the server stops")
    try:
        code = server.stop()
    except KeyboardInterrupt:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait()
        remove_shm(server.keys.shm_prefix)
        return 130
    if dead is not None:
        return code or 1
    return code
