"""What ``edgecap serve`` checks before it starts, what it locks, and what it sweeps (no server runs here)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from edgecap.runtime.serving.lockdown import (
    CONTROL_HEADER,
    GuardError,
    Secrets,
    check_endpoints,
    check_token,
    is_loopback,
    remove_shm,
    restricted_api_flags,
    sweep_stale,
)
from tests.runtime.serving.conftest import free_ports


def test_ports_given_twice_are_refused() -> None:
    with pytest.raises(GuardError, match="--http-port and --metrics-port are both 9000"):
        check_endpoints("127.0.0.1", {"--http-port": 9000, "--grpc-port": 9001, "--metrics-port": 9000})


def test_a_port_held_by_another_process_is_refused_by_name() -> None:
    http, grpc, metrics = free_ports(3)
    with socket.socket() as held:
        held.bind(("127.0.0.1", grpc))
        held.listen()
        with pytest.raises(GuardError, match=f"port {grpc} \\(--grpc-port\\) on 127.0.0.1: already in use"):
            check_endpoints("127.0.0.1", {"--http-port": http, "--grpc-port": grpc, "--metrics-port": metrics})
    check_endpoints("127.0.0.1", {"--http-port": http, "--grpc-port": grpc, "--metrics-port": metrics})


def test_a_host_that_does_not_resolve_is_refused() -> None:
    with pytest.raises(GuardError, match="cannot listen on --host"):
        check_endpoints("no-such-host.invalid", {"--http-port": free_ports(1)[0]})


@pytest.mark.parametrize("token", ["short", "with space in it 1234", "ünïcode-token-123456", "x" * 257])
def test_a_token_a_header_cannot_carry_or_too_short_is_refused(token: str) -> None:
    with pytest.raises(GuardError, match="EDGECAP_SERVE_TOKEN must be 16 to 256"):
        check_token(token)


def test_an_empty_token_is_no_token() -> None:
    assert check_token("") is None and check_token(None) is None
    assert check_token("a" * 15 + "=") == "a" * 15 + "="


@pytest.mark.parametrize("host,loopback", [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True),
                                           ("localhost", True), ("0.0.0.0", False), ("::", False),
                                           ("192.168.1.4", False), ("gpu-box", False)])  # fmt: skip
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_control_apis_are_always_locked_and_inference_only_with_a_token() -> None:
    open_flags = restricted_api_flags(Secrets())
    assert len(open_flags) == 2 and all("model-repository,shared-memory,trace,logging:" in f for f in open_flags)
    assert all(f"{CONTROL_HEADER}=" in f for f in open_flags) and not any("inference" in f for f in open_flags)
    keys = Secrets(token="t" * 16)
    flags = restricted_api_flags(keys)
    assert f"--http-restricted-api=inference,metadata,model-config,statistics:edgecap-token={'t' * 16}" in flags
    assert f"--grpc-restricted-protocol=inference,metadata,model-config,statistics:edgecap-token={'t' * 16}" in flags
    assert Secrets().control != Secrets().control and len(keys.control) >= 32  # a new secret per start
    assert keys.shm_prefix.startswith(f"edgecap-serve-{os.getpid()}-")


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_sweep_removes_what_dead_servers_left_and_keeps_the_living(tmp_path: Path) -> None:
    temp, shm = tmp_path / "tmp", tmp_path / "shm"
    temp.mkdir()
    shm.mkdir()
    dead = dead_pid()
    (temp / f"edgecap-serve-{dead}-abc").mkdir()
    (temp / f"edgecap-serve-{dead}-abc" / "tritonserver.log").write_text("x")
    (shm / f"edgecap-serve-{dead}-1234-region").write_bytes(b"\0" * 16)
    (temp / f"edgecap-serve-{os.getpid()}-mine").mkdir()  # a running server's
    (temp / "edgecap-serve-other").mkdir()  # not named by a pid
    (temp / "unrelated").mkdir()
    removed = sweep_stale((temp, shm))
    assert sorted(p.name for p in removed) == [f"edgecap-serve-{dead}-1234-region", f"edgecap-serve-{dead}-abc"]
    assert sorted(os.listdir(temp)) == [f"edgecap-serve-{os.getpid()}-mine", "edgecap-serve-other", "unrelated"]
    assert os.listdir(shm) == []


def test_remove_shm_removes_only_its_prefix(tmp_path: Path) -> None:
    (tmp_path / "edgecap-serve-1-aa-x").write_bytes(b"1")
    (tmp_path / "edgecap-serve-1-bb-x").write_bytes(b"1")
    remove_shm("edgecap-serve-1-aa-", tmp_path)
    assert os.listdir(tmp_path) == ["edgecap-serve-1-bb-x"]
