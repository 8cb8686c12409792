"""The real Triton Inference Server (the nvidia-pytriton wheel's binary) serving a bundle through ``edgecap serve``.

The server runs in a ``[cpu,serve]`` venv (nvidia-pytriton pins numpy<2, so it is not the development venv), on
loopback, as a subprocess that every test bounds in time and the fixtures stop. The clients run here.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edgecap.runtime.captioner import Captioner
from tests.runtime.serving.conftest import Served, images, png

tritonclient = pytest.importorskip("tritonclient.http", reason="the [client] extra (tritonclient) is not installed")

from edgecap.client import AsyncCaptionClient, CaptionClient, CaptionRequestError, ServerBusyError  # noqa: E402


@pytest.fixture(scope="module")
def direct(served_bundle: Path) -> Iterator[Captioner]:
    with Captioner.load(served_bundle, runtime="onnxruntime", threads=1) as captioner:
        yield captioner


@pytest.fixture(scope="module")
def server(serve_venv: Path, served_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``edgecap serve BUNDLE``: batches of up to 8, a 100 ms window so concurrent requests share a batch."""
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    args = [str(served_bundle), "--max-batch", "8", "--max-queue-delay-us", "100000", "--threads", "1"]
    served = Served(serve_venv, args, log)
    yield served
    assert served.stop() == 0, log.read_text()[-3000:]


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_served_captions_equal_direct_captions(server: Served, direct: Captioner, scheme: str) -> None:
    arrays = images(6, seed=10)
    port = server.http if scheme == "http" else server.grpc
    with CaptionClient(f"{scheme}://127.0.0.1:{port}", timeout_s=60) as client:
        replies = client.caption_many([png(a) if i % 2 else a for i, a in enumerate(arrays)], concurrency=6)
        detailed = client.caption_result(arrays[0], details=True)
    assert [r.caption for r in replies] == direct.batch(arrays)  # type: ignore[union-attr]
    assert detailed.tokens and detailed.score is not None


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_the_asyncio_client(server: Served, direct: Captioner, scheme: str) -> None:
    import asyncio

    arrays = images(3, seed=11)
    port = server.http if scheme == "http" else server.grpc

    async def run() -> list[object]:
        async with AsyncCaptionClient(f"{scheme}://127.0.0.1:{port}", timeout_s=60) as client:
            return await client.caption_many(arrays, concurrency=3)

    assert [r.caption for r in asyncio.run(run())] == direct.batch(arrays)  # type: ignore[attr-defined]


def test_bad_requests_in_a_batch_fail_alone(server: Served, direct: Captioner) -> None:
    arrays = images(5, seed=12)
    bad: list[object] = [b"not an image", np.zeros((9, 9, 4), np.uint8), b"\x89PNG\r\n\x1a\n truncated"]
    sent = [arrays[0], bad[0], png(arrays[1]), bad[1], arrays[2], bad[2], arrays[3], png(arrays[4])]
    executions = server.counter("nv_inference_exec_count")
    with CaptionClient(f"http://127.0.0.1:{server.http}", timeout_s=60) as client:
        replies = client.caption_many(sent, concurrency=len(sent))
    assert server.counter("nv_inference_exec_count") - executions < len(sent)  # some requests shared a batch
    errors = [r for r in replies if isinstance(r, Exception)]
    assert len(errors) == 3 and all(isinstance(e, CaptionRequestError) for e in errors), errors
    assert [r.caption for r in replies if not isinstance(r, Exception)] == direct.batch(arrays)
    grpc_client = CaptionClient(f"grpc://127.0.0.1:{server.grpc}", timeout_s=60)
    with grpc_client, pytest.raises(CaptionRequestError, match="length"):
        grpc_client.caption(arrays[0], length_level=2)  # this model has no length control


def test_triton_repo_runs_on_the_server_refuses_a_full_queue_and_drains_on_sigterm(
    serve_venv: Path, served_bundle: Path, direct: Captioner, tmp_path: Path
) -> None:
    repo = tmp_path / "models"
    made = subprocess.run(
        [str(serve_venv / "bin" / "edgecap"), "triton-repo", str(served_bundle), str(repo), "--max-batch", "1",
         "--max-queue-size", "1", "--threads", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert (repo / served_bundle.name / "config.pbtxt").is_file()
    served = Served(serve_venv, ["--model-repository", str(repo), "--exit-timeout", "60"], tmp_path / "serve.log")
    try:
        arrays = images(4, seed=13)
        url = f"grpc://127.0.0.1:{served.grpc}"
        with CaptionClient(url, timeout_s=60, retries=0) as client:
            assert client.caption(arrays[0]) == direct(arrays[0])
            burst = client.caption_many([arrays[i % 4] for i in range(32)], concurrency=32)
        refused = [r for r in burst if isinstance(r, ServerBusyError)]
        assert refused, "32 concurrent requests on a queue of 1 were all accepted"
        assert all(isinstance(r, ServerBusyError) or r.caption == direct(arrays[i % 4]) for i, r in enumerate(burst))

        results: list[object] = [None] * 24
        started = threading.Event()

        def send(i: int) -> None:
            started.set()
            with CaptionClient(url, timeout_s=60, retries=0) as one:
                try:
                    results[i] = one.caption(arrays[i % 4])
                except Exception as exc:
                    results[i] = exc

        threads = [threading.Thread(target=send, args=(i,)) for i in range(24)]
        for t in threads[:20]:
            t.start()
        started.wait(10)
        time.sleep(0.05)
        served.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # the drain has begun: what is sent now is refused, on HTTP and gRPC alike
        late = CaptionClient(f"http://127.0.0.1:{served.http}", timeout_s=30, retries=0)
        with late, pytest.raises(ServerBusyError):
            late.caption(arrays[0])
        for t in threads[20:]:
            t.start()
        for t in threads:
            t.join(90)
        assert served.process.wait(timeout=90) == 0, served.log.read_text()[-2000:]  # 0: every accepted one answered
        # nothing lost silently: every request has its caption or an explicit refusal, and the last four were refused
        for i, result in enumerate(results):
            assert result == direct(arrays[i % 4]) or isinstance(result, ServerBusyError), (i, result)
        assert all(isinstance(r, ServerBusyError) for r in results[20:]), results[20:]
        assert "drained" in served.log.read_text()
        with CaptionClient(url, timeout_s=5, retries=1, backoff_s=0.01) as client, pytest.raises(ServerBusyError):
            client.caption(arrays[0])  # the server is gone: refused, not hung
    finally:
        served.stop()


def test_caption_command_with_server(server: Served, direct: Captioner, served_bundle: Path, tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from edgecap.cli import main

    arrays = images(3, seed=14)
    paths = []
    for i, array in enumerate(arrays):
        paths.append(tmp_path / f"{i}.png")
        paths[-1].write_bytes(png(array))
    (tmp_path / "bad.png").write_bytes(b"not a png")
    url = f"grpc://127.0.0.1:{server.grpc}"
    result = CliRunner().invoke(main, ["caption", *map(str, paths), "--server", url, "--json"])
    assert result.exit_code == 0, result.output
    assert list(json.loads(result.stdout).values()) == direct.batch(arrays)
    mixed = CliRunner().invoke(main, ["caption", str(paths[0]), str(tmp_path / "bad.png"), "--server", url])
    assert mixed.exit_code == 1 and f"{paths[0]}: {direct(arrays[0])}" in mixed.stdout
    assert "bad.png" in mixed.stderr and "1 of 2" in mixed.stderr
    local_only = CliRunner().invoke(main, ["caption", str(paths[0]), "--server", url, "--precision", "int8"])
    assert local_only.exit_code != 0 and "--precision does not apply with --server" in local_only.output
    wrong = CliRunner().invoke(main, ["caption", str(paths[0]), "--server", url, "--model", "nope"])
    assert wrong.exit_code == 1, wrong.output  # Triton's own "unknown model" answer: named, not retried
    assert wrong.stderr.strip() == f"Error: {url} does not serve a model 'nope'; it serves {served_bundle.name}"
