"""The client's own logic without a server: URLs, what is retried, what is refused, what a request carries."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tritonclient.http", reason="the [client] extra (tritonclient) is not installed")

from tritonclient.utils import InferenceServerException  # noqa: E402

from edgecap.runtime.serving.client import (  # noqa: E402
    CaptionClient,
    CaptionRequestError,
    ServerBusyError,
    _is_unavailable,
    _module,
    _no_answer,
    _refusal,
    _request,
    _Settings,
    parse_url,
)
from tests.runtime.serving.fakes import FakeTriton  # noqa: E402


@pytest.mark.parametrize(
    "url,parsed",
    [
        ("http://127.0.0.1:8000", ("http", "127.0.0.1:8000")),
        ("grpc://host:8001/", ("grpc", "host:8001")),
        ("localhost:8000", ("http", "localhost:8000")),
        ("GRPC://h:1", ("grpc", "h:1")),
        ("http://[::1]:8000", ("http", "[::1]:8000")),
        ("grpc://h", ("grpc", "h:8001")),  # the protocol's default port
        ("h", ("http", "h:8000")),
    ],
)
def test_urls(url: str, parsed: tuple[str, str]) -> None:
    assert parse_url(url) == parsed


@pytest.mark.parametrize(
    "url", ["ftp://h:1", "http://", "http://h:1/v2/models", "http://[::1", "http://h:port", "http://h:99999",
            "http://:80", "http://h:", "http://u@h:1"]
)  # fmt: skip
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match="server URL"):
        parse_url(url)


@pytest.mark.parametrize("status", ["503", "StatusCode.UNAVAILABLE"])
def test_unavailable_is_retried_and_bad_requests_are_not(status: str) -> None:
    assert _is_unavailable(InferenceServerException("busy", status=status))
    assert _refusal(InferenceServerException("busy", status=status)) is None
    assert _is_unavailable(ConnectionRefusedError())
    drained = "Request for unknown model: 'm' has no available versions"
    assert _is_unavailable(InferenceServerException(drained, status="404"))
    assert _is_unavailable(InferenceServerException(drained, status="StatusCode.NOT_FOUND"))
    refused = _refusal(InferenceServerException("not an image", status="400"))
    assert isinstance(refused, CaptionRequestError) and str(refused) == "not an image"
    assert not _is_unavailable(InferenceServerException("bad", status="StatusCode.INVALID_ARGUMENT"))


def test_a_request_carries_bytes_or_pixels_and_the_options() -> None:
    module = _module("http")
    inputs, outputs = _request(module, b"\xff\xd8jpeg", 2, 3, details=True)
    assert [i.name() for i in inputs] == ["image", "length_level", "beam"]
    assert [o.name() for o in outputs] == ["caption", "tokens", "score"]
    inputs, outputs = _request(module, np.zeros((5, 7, 3), np.uint8), None, None, details=False)
    assert [(i.name(), i.shape(), i.datatype()) for i in inputs] == [("pixels", [1, 5, 7, 3], "UINT8")]
    with pytest.raises(TypeError, match="cannot send"):
        _request(module, 3.5, None, None, details=False)


def test_absurd_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        CaptionClient("http://127.0.0.1:1", timeout_s=0)
    with pytest.raises(ValueError, match="retries"):
        CaptionClient("http://127.0.0.1:1", retries=-1)


def test_no_server_is_unavailable_after_the_retries_not_a_hang() -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for scheme in ("http", "grpc"):
        client = CaptionClient(f"{scheme}://127.0.0.1:{port}", "m", timeout_s=5, retries=1, backoff_s=0.01)
        with client, pytest.raises(ServerBusyError, match="unavailable after 2 tries"):
            client.caption(b"x")


def test_a_call_that_may_have_run_is_not_sent_again() -> None:
    for lost in (
        TimeoutError(),
        ConnectionResetError(),
        InferenceServerException("late", "StatusCode.DEADLINE_EXCEEDED"),
    ):
        assert not _is_unavailable(lost) and _no_answer(lost)
    settings = _Settings("grpc://h:1", None, 5.0, 2, 0.01)
    error = settings.give_up(TimeoutError("read timed out"))
    assert isinstance(error, ServerBusyError) and "not sent again" in str(error)
    other = ValueError("something else")
    assert settings.give_up(other) is other  # raised as it is, never as its own cause


def test_a_model_the_server_does_not_serve_is_named_and_not_retried() -> None:
    import asyncio

    from edgecap.runtime.serving.client import AsyncCaptionClient, ModelNotServedError

    with FakeTriton("real", "READY") as fake:
        client = CaptionClient(fake.url, "wrong", retries=3, backoff_s=0.01)
        with client, pytest.raises(ModelNotServedError, match="does not serve a model 'wrong'; it serves real"):
            client.caption(b"x")
        assert fake.infers == 1  # asked once: a wrong name is not worth asking again

        async def asynchronous() -> None:
            async with AsyncCaptionClient(fake.url, "wrong", retries=3, backoff_s=0.01) as client:
                with pytest.raises(ModelNotServedError, match="it serves real"):
                    await client.caption(b"x")

        asyncio.run(asynchronous())
        assert fake.infers == 2


def test_a_drained_model_is_still_unavailable_and_retried() -> None:
    with FakeTriton("m", "UNAVAILABLE") as fake:  # in the repository, unloaded: what a drain leaves
        client = CaptionClient(fake.url, "m", retries=1, backoff_s=0.01)
        with client, pytest.raises(ServerBusyError, match="unavailable after 2 tries"):
            client.caption(b"x")
        assert fake.infers == 2


def test_a_server_that_takes_the_connection_and_never_answers_fails_in_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio
    import socket
    import time

    import edgecap.runtime.serving.client as client_module
    from edgecap.runtime.serving.client import AsyncCaptionClient

    monkeypatch.setattr(client_module, "CONNECT_TIMEOUT_S", 1.0)
    with socket.socket() as silent:  # the kernel completes the handshakes; nothing ever reads or answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        port = silent.getsockname()[1]
        for scheme in ("http", "grpc"):
            started = time.monotonic()
            client = CaptionClient(f"{scheme}://127.0.0.1:{port}", "m", timeout_s=60, retries=2)
            with client, pytest.raises(ServerBusyError, match="did not answer in 1 s"):
                client.caption(b"x")
            assert time.monotonic() - started < 15, scheme

            async def asynchronous(url: str) -> None:
                async with AsyncCaptionClient(url, "m", timeout_s=60, retries=2) as client:
                    with pytest.raises(ServerBusyError, match="did not answer in 1 s"):
                        await client.caption(b"x")

            started = time.monotonic()
            asyncio.run(asynchronous(f"{scheme}://127.0.0.1:{port}"))
            assert time.monotonic() - started < 15, scheme
