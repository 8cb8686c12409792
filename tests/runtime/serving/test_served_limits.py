"""Every request to the real ``edgecap serve`` is bounded before memory is spent (docs/serving.md, "Limits").

One server with small limits: 4 Mpx per image, 16 MiB per HTTP request, 32 MiB of HTTP bodies in flight, 24 MiB of
input per batch. It runs in the ``[cpu,serve]`` venv on loopback, like test_triton_server.py.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
from PIL import Image

from edgecap.client import CaptionClient, CaptionRequestError, ServerBusyError  # noqa: E402, I001
from edgecap.runtime.captioner import Captioner  # noqa: E402
from tests.runtime.serving.conftest import Served, images
from tests.runtime.serving.test_triton_server import direct  # noqa: F401 (a fixture)

MAX_PIXELS = 4_000_000


@pytest.fixture(scope="module")
def bounded(serve_venv: Path, served_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    log = tmp_path_factory.mktemp("serve-bounded") / "serve.log"
    args = [str(served_bundle), "--max-batch", "8", "--max-queue-delay-us", "100000", "--threads", "1",
            "--max-pixels", str(MAX_PIXELS), "--max-request-mb", "16", "--max-inflight-mb", "32",
            "--max-batch-mb", "24"]  # fmt: skip
    served = Served(serve_venv, args, log)
    yield served
    assert served.stop() == 0, log.read_text()[-3000:]


@pytest.fixture(scope="module")
def big_png() -> bytes:
    """8000×8000 pixels (192 MB decoded, 64 Mpx: over the limit, under Pillow's) in about 200 KB."""
    out = io.BytesIO()
    Image.new("RGB", (8000, 8000), (90, 120, 30)).save(out, format="PNG")
    return out.getvalue()


def _tree_memory(pid: int) -> int:
    """The process tree's proportional set size: Triton's shared-memory pool, mapped by the server and the backend
    stub, counts once (RSS would count it twice)."""
    total = 0
    root = psutil.Process(pid)
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += process.memory_full_info().pss
    return total


def test_a_huge_declared_shape_gets_400_and_the_next_request_is_answered(
    bounded: Served,
    direct: Captioner,  # noqa: F811
    served_bundle: Path,
) -> None:
    hostile = b'{"inputs":[{"name":"pixels","datatype":"UINT8","shape":[1,100000,100000,3],"data":[1,2,3]}]}'
    for body in (hostile, hostile.replace(b"100000,100000", b"1000,1000"), b'{"inputs":[{"name":"pix'):
        connection = http.client.HTTPConnection("127.0.0.1", bounded.http, timeout=30)
        connection.request("POST", f"/v2/models/{served_bundle.name}/infer", body=body)
        reply = connection.getresponse()
        assert reply.status == 400, (body, reply.status)
        assert json.loads(reply.read())["error"]
        connection.close()
    assert bounded.process.poll() is None
    array = images(1, seed=20)[0]
    with CaptionClient(f"http://127.0.0.1:{bounded.http}", timeout_s=60) as client:
        assert client.caption(array) == direct(array)


def test_an_image_over_the_pixel_limit_gets_its_own_400_while_a_batch_mate_gets_its_caption(
    bounded: Served,
    direct: Captioner,  # noqa: F811
    big_png: bytes,
) -> None:
    arrays = images(3, seed=21)
    sent: list[object] = [big_png, arrays[0], arrays[1], big_png, arrays[2]]
    executions = bounded.counter("nv_inference_exec_count")
    with CaptionClient(f"grpc://127.0.0.1:{bounded.grpc}", timeout_s=60) as client:
        replies = client.caption_many(sent, concurrency=len(sent))
    assert bounded.counter("nv_inference_exec_count") - executions < len(sent)  # batch-mates shared a batch
    for index in (0, 3):
        assert isinstance(replies[index], CaptionRequestError), replies[index]
        assert f"limit of {MAX_PIXELS} pixels" in str(replies[index])
    assert [getattr(replies[i], "caption", replies[i]) for i in (1, 2, 4)] == direct.batch(arrays)


def test_concurrent_large_images_stay_under_a_memory_bound(bounded: Served, big_png: bytes) -> None:
    """8 clients × 2 requests of a 64 Mpx PNG, and 8 raw 1600×1600 arrays (7.7 MB each, 61 MB together, over the
    32 MiB in flight): the PNGs are refused from their header, the arrays are answered or turned away as busy, and
    the server's process tree grows by less than one of those PNGs decoded."""
    rng = np.random.default_rng(22)
    arrays = [rng.integers(0, 256, (1600, 1600, 3), dtype=np.uint8) for _ in range(2)]
    baseline = _tree_memory(bounded.process.pid)
    peaks, done = {"png": baseline, "raw": baseline}, threading.Event()
    phase = ["png"]

    def sample() -> None:
        while not done.wait(0.05):
            peaks[phase[0]] = max(peaks[phase[0]], _tree_memory(bounded.process.pid))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with CaptionClient(f"http://127.0.0.1:{bounded.http}", timeout_s=120, retries=2, backoff_s=0.2) as client:
            pngs = client.caption_many([big_png] * 16, concurrency=8)
            phase[0] = "raw"
            raws = client.caption_many([arrays[i % 2] for i in range(8)], concurrency=8)
    finally:
        done.set()
        sampler.join()
    assert all(isinstance(r, CaptionRequestError) and "pixels" in str(r) for r in pngs), pngs
    assert all(isinstance(r, ServerBusyError) or getattr(r, "caption", "") for r in raws), raws
    assert any(getattr(r, "caption", "") for r in raws), raws
    # unbounded, each PNG decodes to 192 MB, and Pillow copies it once more to convert it
    assert peaks["png"] - baseline < 64 << 20, f"the PNGs grew the server by {(peaks['png'] - baseline) >> 20} MiB"
    # the arrays: at most 32 MiB of bodies in flight, each held by the front, Triton and its backend's pool
    assert peaks["raw"] - baseline < 256 << 20, f"the arrays grew the server by {(peaks['raw'] - baseline) >> 20} MiB"
    assert bounded.process.poll() is None
