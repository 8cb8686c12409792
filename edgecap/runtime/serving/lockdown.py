"""What ``edgecap serve`` checks before it starts Triton, what it locks, and what it leaves behind (nothing).

* **Locked APIs.** Triton's model-repository API (load, unload, index) runs whatever Python a client uploads, and
  its shared-memory, trace and logging APIs reach the server's memory and files. :func:`restricted_api_flags`
  restricts them to a header whose value is a random secret of each start (:class:`Secrets`), which only
  ``edgecap serve`` sends (to drain). With an inference token, inference, metadata, model configuration and
  statistics need the token's header too; health stays open for load balancers.
* **Start-up checks.** The three ports are distinct and free on the host (:func:`check_endpoints`), and a token
  has a form a header can carry (:func:`check_token`), before anything starts.
* **Nothing left behind.** The work folder and the Python backend's shared-memory regions carry the owning pid in
  their names (``edgecap-serve-PID-…``); a clean exit removes its own, and each start removes those whose owner
  died without cleaning (SIGKILL runs no code, so the next start is the earliest moment): :func:`sweep_stale`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import shutil
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import psutil

#: The HTTP header that carries the inference token (``--http-restricted-api``).
TOKEN_HEADER = "edgecap-token"
#: The gRPC metadata key that carries it: Triton prefixes ``--grpc-restricted-protocol`` keys with this.
GRPC_TOKEN_HEADER = f"triton-grpc-protocol-{TOKEN_HEADER}"
#: The environment variable ``edgecap serve`` and ``edgecap caption --server`` read the token from.
TOKEN_ENV = "EDGECAP_SERVE_TOKEN"
#: The header of the control secret (model repository, shared memory, trace, logging).
CONTROL_HEADER = "edgecap-control"
#: What only the control secret opens.
CONTROL_APIS = ("model-repository", "shared-memory", "trace", "logging")
#: What the inference token opens (health stays open: probes carry no secrets).
TOKEN_APIS = ("inference", "metadata", "model-config", "statistics")
#: Names of what a server leaves in the temp folder and /dev/shm: ``edgecap-serve-<pid>-<random>``.
PREFIX = "edgecap-serve-"
_OWNED = re.compile(rf"^{PREFIX}(\d+)-")
_TOKEN = re.compile(r"^[A-Za-z0-9._~+/=-]{16,256}$")
SHM_DIR = Path("/dev/shm")


class GuardError(ValueError):
    """A start-up check failed: the message says which and why."""


@dataclass(frozen=True)
class Secrets:
    """One start's secrets: the control header's value, the server id (its metadata name, so readiness is known to
    come from this server) and the shared-memory prefix of its Python backend; plus the optional inference token."""

    token: str | None = None
    control: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    server_id: str = field(default_factory=lambda: f"edgecap-{secrets.token_hex(8)}")
    shm_prefix: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}-")

    def headers(self) -> dict[str, str]:
        """What ``edgecap serve``'s own requests carry: the control secret, and the token when there is one."""
        sent = {CONTROL_HEADER: self.control}
        if self.token:
            sent[TOKEN_HEADER] = self.token
        return sent


def restricted_api_flags(keys: Secrets) -> list[str]:
    """Triton flags that lock :data:`CONTROL_APIS` behind the control secret and, with a token,
    :data:`TOKEN_APIS` behind it, on HTTP and gRPC alike."""
    rules = [(CONTROL_APIS, CONTROL_HEADER, keys.control)]
    if keys.token:
        rules.append((TOKEN_APIS, TOKEN_HEADER, keys.token))
    flags = []
    for apis, header, value in rules:
        spec = f"{','.join(apis)}:{header}={value}"
        flags += [f"--http-restricted-api={spec}", f"--grpc-restricted-protocol={spec}"]
    return flags


def check_token(token: str | None) -> str | None:
    """The token, or None when unset or empty; refuses one a header cannot carry or that is too short to guess."""
    if not token:
        return None
    if not _TOKEN.fullmatch(token):
        raise GuardError(
            f"${TOKEN_ENV} must be 16 to 256 characters of letters, digits and ._~+/=- "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return token


def is_loopback(host: str) -> bool:
    """True when ``host`` listens on this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_endpoints(host: str, ports: dict[str, int]) -> None:
    """Refuse ports given twice, an address this machine cannot listen on, and a port something else holds
    (a bind test; Triton's own bind reports a port taken in between)."""
    seen: dict[int, str] = {}
    for flag, port in ports.items():
        if port in seen:
            raise GuardError(f"{seen[port]} and {flag} are both {port}: HTTP, gRPC and metrics need a port each")
        seen[port] = flag
    for flag, port in ports.items():
        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]
        except socket.gaierror as exc:
            raise GuardError(f"cannot listen on --host {host!r}: {exc.strerror}") from exc
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is no conflict
            try:
                probe.bind(address)
            except OSError as exc:
                reason = "already in use" if exc.errno == 98 else (exc.strerror or str(exc))
                raise GuardError(f"port {port} ({flag}) on {host}: {reason}") from exc


def work_folder() -> Path:
    """A new private folder for one server (``$TMPDIR/edgecap-serve-<pid>-<random>``), after sweeping the folders
    and shared-memory regions of servers that died without cleaning up."""
    sweep_stale()
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))


def remove_shm(prefix: str, shm_dir: Path = SHM_DIR) -> None:
    """Remove the shared-memory regions whose names start with ``prefix`` (the server has exited)."""
    if prefix and shm_dir.is_dir():
        for region in shm_dir.glob(f"{prefix}*"):
            with contextlib.suppress(OSError):
                region.unlink()


def sweep_stale(roots: tuple[Path, ...] | None = None) -> list[Path]:
    """Remove this user's ``edgecap-serve-<pid>-…`` folders and regions whose process is gone (or whose pid now
    belongs to a process started after them); returns what was removed."""
    removed = []
    for root in roots if roots is not None else (Path(tempfile.gettempdir()), SHM_DIR):
        if not root.is_dir():
            continue
        for path in root.glob(f"{PREFIX}*"):
            match = _OWNED.match(path.name)
            try:
                info = path.lstat()
            except OSError:
                continue
            if match is None or info.st_uid != os.getuid() or _alive(int(match.group(1)), info.st_ctime):
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
            removed.append(path)
    return removed


def _alive(pid: int, made_at: float) -> bool:
    """Whether ``pid`` may still own something made at ``made_at``: it runs and started no later than that."""
    try:
        return psutil.Process(pid).create_time() <= made_at + 1.0
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.Error:
        return True  # not ours to judge: keep it
