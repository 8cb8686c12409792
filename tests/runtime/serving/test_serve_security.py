"""Hostile requests and failed starts against the real Triton server behind ``edgecap serve`` (loopback only).

A client must not load a model of its own (a ``model.py`` runs as the server's user), unload the served one, or
reach the server's shared memory; with a token, requests without it are refused. A failed or killed server leaves
no work folder and no shared-memory region behind, and a dead model instance takes readiness down with it.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from edgecap.runtime.captioner import Captioner
from tests.runtime.serving.conftest import Served, free_ports, images, png

pytest.importorskip("tritonclient.http", reason="the [client] extra (tritonclient) is not installed")

import tritonclient.grpc as grpc_client  # noqa: E402

from edgecap.client import CaptionClient  # noqa: E402

TOKEN = "test-token-0123456789abcdef"
AUTH = {"edgecap-token": TOKEN}
SHM = Path("/dev/shm")


@pytest.fixture(scope="module")
def guarded(serve_venv: Path, served_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``edgecap serve BUNDLE`` with ``$EDGECAP_SERVE_TOKEN`` set."""
    log = tmp_path_factory.mktemp("guarded") / "serve.log"
    served = Served(serve_venv, [str(served_bundle), "--threads", "1"], log, env={"EDGECAP_SERVE_TOKEN": TOKEN})
    yield served
    assert served.stop() == 0, log.read_text()[-3000:]


def call(served: Served, path: str, body: dict | None = None, headers: dict[str, str] | None = None) -> int:
    """The HTTP status of GET (no body) or POST ``path``."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{served.http}{path}", data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


def evil_model(marker: Path) -> tuple[str, str]:
    """(config JSON, model.py) of a Python model that writes ``marker`` as soon as Triton imports it."""
    config = {
        "backend": "python",
        "max_batch_size": 0,
        "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]}],
    }
    code = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\nclass TritonPythonModel:\n    pass\n"
    return json.dumps(config), code


def test_a_client_can_neither_upload_nor_unload_a_model(guarded: Served, served_bundle: Path, tmp_path: Path) -> None:
    name = served_bundle.name
    marker = tmp_path / "marker"
    config, code = evil_model(marker)
    upload = {"parameters": {"config": config, "file:1/model.py": base64.b64encode(code.encode()).decode()}}
    for model in ("evil", name):  # a new model, and the served one replaced
        for headers in ({}, AUTH):  # the inference token opens inference, never the repository
            assert call(guarded, f"/v2/repository/models/{model}/load", upload, headers) == 403
    for headers in ({}, AUTH):
        assert call(guarded, f"/v2/repository/models/{name}/unload", {}, headers) == 403
        assert call(guarded, "/v2/repository/index", {}, headers) == 403
        assert call(guarded, "/v2/systemsharedmemory/region/x/register", {"key": "/x", "byte_size": 8}, headers) == 403
    grpc = grpc_client.InferenceServerClient(f"127.0.0.1:{guarded.grpc}")
    grpc_auth = {"triton-grpc-protocol-edgecap-token": TOKEN}  # how Triton reads a restricted gRPC header
    with pytest.raises(Exception, match="restricted"):
        grpc.load_model("evil", headers=grpc_auth, config=config, files={"file:1/model.py": code.encode()})
    with pytest.raises(Exception, match="restricted"):
        grpc.unload_model(name, headers=grpc_auth)
    assert grpc.is_model_ready(name, headers=grpc_auth)  # the token itself works on gRPC
    grpc.close()
    time.sleep(1)
    assert not marker.exists()
    # still served, and readiness says so
    assert call(guarded, "/v2/health/ready") == 200 and call(guarded, f"/v2/models/{name}/ready", None, AUTH) == 200
    with CaptionClient(f"http://127.0.0.1:{guarded.http}", timeout_s=60, token=TOKEN) as client:
        assert client.caption(images(1, seed=20)[0])


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_the_token_is_required_and_enough(guarded: Served, served_bundle: Path, scheme: str) -> None:
    array = images(1, seed=21)[0]
    url = f"{scheme}://127.0.0.1:{guarded.http if scheme == 'http' else guarded.grpc}"
    with Captioner.load(served_bundle, runtime="onnxruntime", threads=1) as direct:
        expected = direct(array)
    for model, token in ((None, None), (served_bundle.name, None), (served_bundle.name, "x" * 16)):
        client = CaptionClient(url, model, timeout_s=60, retries=2, token=token)
        with client, pytest.raises(Exception, match="edgecap-token"):  # no token (model named or asked), a wrong one
            client.caption(png(array))
    with CaptionClient(url, timeout_s=60, token=TOKEN) as client:  # the model found with the token too
        assert client.caption(array) == expected
    assert call(guarded, "/v2/health/live") == 200  # probes need no token


def test_caption_server_sends_the_token_from_the_environment(
    guarded: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from edgecap.cli import main

    image = tmp_path / "a.png"
    image.write_bytes(png(images(1, seed=22)[0]))
    args = ["caption", str(image), "--server", f"grpc://127.0.0.1:{guarded.grpc}"]
    monkeypatch.delenv("EDGECAP_SERVE_TOKEN", raising=False)
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code != 0 and "edgecap-token" in refused.output
    monkeypatch.setenv("EDGECAP_SERVE_TOKEN", TOKEN)
    answered = CliRunner().invoke(main, args)
    assert answered.exit_code == 0 and f"{image}: " in answered.stdout, answered.output


def test_a_second_server_on_taken_ports_is_refused(guarded: Served, serve_venv: Path, served_bundle: Path) -> None:
    second = subprocess.run(
        [str(serve_venv / "bin" / "edgecap"), "serve", str(served_bundle), "--http-port", str(guarded.http),
         "--grpc-port", str(guarded.grpc + 1000), "--metrics-port", str(guarded.metrics + 1000)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert second.returncode == 1 and "serving" not in second.stderr
    assert f"port {guarded.http} (--http-port) on 127.0.0.1: already in use" in second.stderr
    assert call(guarded, "/v2/health/ready") == 200  # the first one is untouched


def owned(root: Path, pid: int) -> list[Path]:
    return sorted(root.glob(f"edgecap-serve-{pid}-*"))


def test_a_failed_start_leaves_no_shared_memory(serve_venv: Path, served_bundle: Path, tmp_path: Path) -> None:
    """Triton loads the model, then cannot bind a port (taken after ``edgecap serve``'s own check, as in a race):
    stopping removes the Python backend's shared-memory region, which Triton leaves behind."""
    http, grpc, metrics = free_ports(3)
    script = f"""
import socket
from pathlib import Path
from edgecap.runtime.serving.repository import ServingOptions, write_triton_repository
from edgecap.runtime.serving.server import Endpoints, ServerError, TritonServer
held = socket.socket(); held.bind(("127.0.0.1", {grpc})); held.listen()
work = Path({str(tmp_path / "work")!r}); work.mkdir()
write_triton_repository([Path({str(served_bundle)!r})], work / "models", ServingOptions(threads=1), link=True)
server = TritonServer(work / "models", work, Endpoints("127.0.0.1", {http}, {grpc}, {metrics})).start()
try:
    server.wait_ready(timeout_s=120)
except ServerError as exc:
    print("refused:", str(exc).splitlines()[0])
print("prefix:", server.keys.shm_prefix)
server.stop(timeout_s=0)
"""
    result = subprocess.run([str(serve_venv / "bin" / "python"), "-c", script], capture_output=True, text=True)
    assert "refused: tritonserver exited before it was ready" in result.stdout, result.stdout + result.stderr
    prefix = result.stdout.split("prefix: ")[1].strip()
    assert prefix.startswith("edgecap-serve-") and not list(SHM.glob(f"{prefix}*"))


def stubs_of(served: Served) -> list[psutil.Process]:
    triton = [p for p in psutil.Process(served.process.pid).children() if p.name() == "tritonserver"]
    assert len(triton) == 1
    return triton[0].children()


def test_sigkill_leaves_a_folder_the_next_start_sweeps_and_a_dead_instance_stops_the_server(
    serve_venv: Path, served_bundle: Path, tmp_path: Path
) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {"TMPDIR": str(temp)}
    first = Served(serve_venv, [str(served_bundle), "--threads", "1"], tmp_path / "first.log", env=env)
    assert stubs_of(first) and owned(temp, first.process.pid) and owned(SHM, first.process.pid)
    first.process.send_signal(signal.SIGKILL)  # runs no code: the server follows (parent-death signal) ...
    first.process.wait()
    deadline = time.monotonic() + 60
    while first.ready() is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert owned(temp, first.process.pid)  # ... and the work folder is what SIGKILL leaves

    second = Served(serve_venv, [str(served_bundle), "--threads", "1"], tmp_path / "second.log", env=env)
    try:
        assert not owned(temp, first.process.pid) and not owned(SHM, first.process.pid)  # swept at start
        stubs = stubs_of(second)
        assert stubs and owned(SHM, second.process.pid)
        stubs[0].kill()  # Triton would answer ready for a model that fails every request
        assert second.process.wait(timeout=60) == 1
    finally:
        second.stop()
    log = (tmp_path / "second.log").read_text()
    assert f"model instance process (pid {stubs[0].pid}) died" in log
    assert second.ready() is None
    assert not owned(temp, second.process.pid) and not owned(SHM, second.process.pid)
    assert not list(temp.glob("edgecap-serve-*"))  # (other libraries may leave files of their own in TMPDIR)


def serve(venv: Path, args: list[str], env: dict[str, str]) -> tuple[int, str, int]:
    """(status, stderr, pid) of ``edgecap serve ARGS`` expected to stop by itself (a refused or failed start)."""
    command = [str(venv / "bin" / "edgecap"), "serve", *args]
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ, **env}) as process:
        try:
            _, stderr = process.communicate(timeout=180)
        finally:
            process.kill()
    return process.returncode, stderr, process.pid


def test_refused_starts_say_why_in_one_line_and_leave_nothing(
    serve_venv: Path, served_bundle: Path, tmp_path: Path
) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {"TMPDIR": str(temp)}
    http, grpc, metrics = (str(p) for p in free_ports(3))
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = {  # used to hang silently; used to print Triton's 386-line usage
        "no models in": ["--model-repository", str(empty), "--http-port", http, "--grpc-port", grpc],
        "--http-port and --grpc-port are both": [str(served_bundle), "--http-port", http, "--grpc-port", http],
        "--grpc-port and --metrics-port are both": [str(served_bundle), "--grpc-port", grpc, "--metrics-port", grpc],
    }
    for expected, args in cases.items():
        code, stderr, _ = serve(serve_venv, args, env)
        assert code == 1 and stderr.startswith("Error: ") and expected in stderr
        assert len(stderr.splitlines()) == 1 and "serving" not in stderr, stderr
    assert os.listdir(temp) == []


def test_a_public_host_without_a_token_warns_and_a_failed_start_leaves_nothing(
    serve_venv: Path, tmp_path: Path
) -> None:
    """``--host 0.0.0.0`` without ``$EDGECAP_SERVE_TOKEN`` warns before Triton starts. The repository's one model
    cannot load, so Triton exits before it opens any port (nothing listens beyond loopback, even briefly), and
    the failed start leaves no work folder and no shared memory."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    broken = tmp_path / "models" / "broken"
    (broken / "1").mkdir(parents=True)
    (broken / "config.pbtxt").write_text('backend: "no-such-backend"\nmax_batch_size: 0\n')
    ports = [str(p) for p in free_ports(3)]
    args = ["--model-repository", str(tmp_path / "models"), "--host", "0.0.0.0", "--http-port", ports[0]]
    args += ["--grpc-port", ports[1], "--metrics-port", ports[2]]
    code, stderr, pid = serve(serve_venv, args, {"TMPDIR": str(temp), "EDGECAP_SERVE_TOKEN": ""})
    assert code == 1 and "Warning: listening on 0.0.0.0 without authentication" in stderr, stderr[-3000:]
    assert "Error: tritonserver exited before it was ready" in stderr and "\nserving " not in stderr
    assert not list(temp.glob("edgecap-serve-*")) and not owned(SHM, pid)
    code, stderr, _ = serve(serve_venv, args, {"TMPDIR": str(temp), "EDGECAP_SERVE_TOKEN": TOKEN})
    assert code == 1 and "tritonserver exited" in stderr and "Warning" not in stderr
