"""Caption through a running ``edgecap serve`` (or any Triton serving an edgecap repository): sync and asyncio.

Built on NVIDIA's ``tritonclient`` (the ``[client]`` extra), over HTTP or gRPC. Every image is its own request, so
the server's dynamic batcher (not the client) decides batches and one bad image never fails another. What the
client adds is what a caller would otherwise write around every call:

* **timeouts**: each call gives up after ``timeout_s`` instead of waiting forever on a stuck network; a call that
  timed out or lost its connection is not sent again (it may have run) and raises :class:`ServerBusyError`;
* **retries on UNAVAILABLE**: a server that turns a request away before running it (starting, queue full,
  draining, not listening) is asked again ``retries`` times with exponential backoff, then
  :class:`ServerBusyError`;
* **clear errors**: a request the model refuses (not an image, a level out of range) raises
  :class:`CaptionRequestError` with the server's reason, never retried; a model the server does not serve raises
  :class:`ModelNotServedError` with the models it does serve, never retried;
* **a bounded first contact**: before its first request a client asks the server whether it is live, within
  :data:`CONNECT_TIMEOUT_S` (or ``timeout_s`` when shorter), so a wrong address, or a port that takes connections
  and never answers, fails in seconds instead of after a whole ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.parse
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from edgecap.runtime.serving.lockdown import GRPC_TOKEN_HEADER, TOKEN_HEADER
from edgecap.runtime.serving.protocol import (
    BEAM,
    CAPTION,
    IMAGE,
    LENGTH_LEVEL,
    PIXELS,
    SCORE,
    TOKENS,
    CaptionReply,
)

INSTALL_HINT = "pip install 'edgecap[client]' (tritonclient)"
#: Seconds the server gets to answer a client's first contact (its liveness), and to accept a connection.
CONNECT_TIMEOUT_S = 10.0
#: The ports ``edgecap serve`` (and Triton) listen on unless told otherwise: a URL without one means these.
DEFAULT_PORTS = {"http": 8000, "grpc": 8001}


class CaptionRequestError(ValueError):
    """The server refused this request (bad image, shape, level or beam): its reason, from the server."""


class ModelNotServedError(LookupError):
    """The server does not serve the model asked for (a wrong name): sending it again cannot help."""


class ServerBusyError(RuntimeError):
    """No caption came back: the server stayed unavailable (not ready, draining, queue full, not listening) through
    every retry, or the call timed out or lost its connection (not retried: the request may have run)."""


def parse_url(url: str) -> tuple[str, str]:
    """``http://host:port`` / ``grpc://host:port`` / ``host:port`` (HTTP) -> ``(protocol, "host:port")``; a URL
    without a port gets the protocol's default (:data:`DEFAULT_PORTS`). Raises ValueError for anything else."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "http", url
    scheme = scheme.lower()
    rest = rest.rstrip("/")
    usage = f"server URL must be http://HOST:PORT or grpc://HOST:PORT, got {url!r}"
    if scheme not in ("http", "grpc") or not rest or any(c in rest for c in "/?#@ \t"):
        raise ValueError(usage)
    try:
        parts = urllib.parse.urlsplit(f"//{rest}")
        host, port = parts.hostname, parts.port  # a bad IPv6 literal or port raises ValueError here
    except ValueError as exc:
        raise ValueError(f"{usage} ({exc})") from None
    if not host:
        raise ValueError(usage)
    if port is None:
        if rest.endswith(":"):
            raise ValueError(usage)
        port = DEFAULT_PORTS[scheme]
    return scheme, f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _module(protocol: str, asynchronous: bool = False) -> Any:
    try:
        if protocol == "grpc":
            import tritonclient.grpc as grpc_client
            import tritonclient.grpc.aio as grpc_aio

            return grpc_aio if asynchronous else grpc_client
        import tritonclient.http as http_client
        import tritonclient.http.aio as http_aio

        return http_aio if asynchronous else http_client
    except ImportError as exc:
        raise ImportError(f"the caption client needs tritonclient: {INSTALL_HINT} ({exc})") from exc


def _image_input(module: Any, image: Any) -> Any:
    """One image -> its Triton input: a path or bytes travel encoded (the server decodes), an array as pixels."""
    if isinstance(image, (str, Path)):
        image = Path(image).read_bytes()
    if hasattr(image, "getbands"):  # a PIL image: send its pixels as they are
        image = np.asarray(image.convert("RGB"))
    if isinstance(image, (bytes, bytearray, memoryview)):
        tensor = module.InferInput(IMAGE, [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[bytes(image)]], dtype=np.object_))
        return tensor
    if isinstance(image, np.ndarray):
        pixels = np.ascontiguousarray(image)[None]
        tensor = module.InferInput(PIXELS, list(pixels.shape), "UINT8")
        tensor.set_data_from_numpy(pixels)  # a wrong dtype or shape is refused by the server, with its reason
        return tensor
    raise TypeError(f"cannot send {type(image).__name__}: give a path, encoded bytes, a PIL image or an H×W×3 array")


def _request(module: Any, image: Any, length_level: int | None, beam: int | None, details: bool) -> tuple[list, list]:
    inputs = [_image_input(module, image)]
    for name, value in ((LENGTH_LEVEL, length_level), (BEAM, beam)):
        if value is not None:
            tensor = module.InferInput(name, [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
            inputs.append(tensor)
    names = (CAPTION, TOKENS, SCORE) if details else (CAPTION,)
    return inputs, [module.InferRequestedOutput(name) for name in names]


def _reply(result: Any, details: bool) -> CaptionReply:
    caption = result.as_numpy(CAPTION).reshape(-1)[0]
    text = caption.decode() if isinstance(caption, bytes) else str(caption)
    if not details:
        return CaptionReply(text)
    tokens = tuple(int(t) for t in result.as_numpy(TOKENS).reshape(-1) if t >= 0)
    return CaptionReply(text, tokens, float(result.as_numpy(SCORE).reshape(-1)[0]))


def _status(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    return str(status() or "") if callable(status) else ""


def _is_unavailable(exc: BaseException) -> bool:
    """The server turned the request away before running it, so sending it again is safe: UNAVAILABLE (gRPC) or
    503 (HTTP: not ready, queue full), the model unloaded by a drain (404 / NOT_FOUND "unknown model"), or no
    connection at all (refused)."""
    if isinstance(exc, (ConnectionRefusedError, ServerBusyError)):
        return True
    if "restricted, expecting header" in str(exc):  # no token, or a wrong one: asking again will not help
        return False
    status = _status(exc)
    if status in ("503", "StatusCode.UNAVAILABLE") or "Exceeds maximum queue size" in str(exc):
        return True
    return status in ("404", "StatusCode.NOT_FOUND") and "unknown model" in str(exc)


def _no_answer(exc: BaseException) -> bool:
    """The request was sent and no answer came (a timeout, a connection lost mid-call): it may have run, so it is
    not sent again; the caller learns it as :class:`ServerBusyError`."""
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError, ConnectionError, OSError)):
        return not isinstance(exc, FileNotFoundError)
    if _status(exc) == "StatusCode.DEADLINE_EXCEEDED":
        return True
    return type(exc).__module__.split(".")[0] in ("aiohttp", "geventhttpclient")  # their connection errors


def _unknown_model(exc: BaseException) -> bool:
    """Triton's answer for a model it cannot run: a wrong name (404 or 400 "is not found") or a model unloaded by a
    drain (404 "has no available versions"); the models the server runs tell the two apart."""
    known = ("400", "404", "StatusCode.NOT_FOUND", "StatusCode.INVALID_ARGUMENT")
    return _status(exc) in known and "unknown model" in str(exc).lower()


def _served(stats: Any) -> list[str]:
    """The models the server runs now, from its inference statistics (HTTP: a dict, gRPC: a message); the
    repository index is closed to clients (``edgecap serve`` locks it), statistics are not."""
    models = stats["model_stats"] if isinstance(stats, dict) else stats.model_stats
    return sorted({str(m["name"] if isinstance(m, dict) else m.name) for m in models})


def _refusal(exc: BaseException) -> CaptionRequestError | None:
    status = str(getattr(exc, "status", lambda: "")() or "")
    if status in ("400", "StatusCode.INVALID_ARGUMENT"):
        message = getattr(exc, "message", lambda: str(exc))()
        return CaptionRequestError(str(message))
    return None


class _Settings:
    def __init__(
        self,
        url: str,
        model: str | None,
        timeout_s: float,
        retries: int,
        backoff_s: float,
        token: str | None = None,
    ) -> None:
        self.protocol, self.address = parse_url(url)
        key = GRPC_TOKEN_HEADER if self.protocol == "grpc" else TOKEN_HEADER  # Triton's name for it on gRPC
        self.headers = {key: token} if token else {}
        if timeout_s <= 0 or retries < 0 or backoff_s < 0:
            raise ValueError(
                f"need timeout_s > 0, retries >= 0, backoff_s >= 0; got {timeout_s}, {retries}, {backoff_s}"
            )
        self.model, self.timeout_s, self.retries, self.backoff_s = model, timeout_s, retries, backoff_s

    def retry_after(self, exc: BaseException, attempt: int) -> float:
        """Seconds to wait before sending the request again, after ``attempt`` (0-based) failed with ``exc``; raises
        the error the caller gets when it is not sent again."""
        if _refusal(exc) is None and _is_unavailable(exc) and attempt < self.retries:
            return self.backoff_s * (2**attempt)
        error = self.give_up(exc)
        if error is exc:
            raise exc
        raise error from exc

    def extra(self) -> dict[str, Any]:
        """``infer`` keywords: the headers, and gRPC's own deadline (HTTP's is the connection's, set when made)."""
        return {"headers": self.headers, **({"client_timeout": self.timeout_s} if self.protocol == "grpc" else {})}

    def give_up(self, exc: BaseException) -> Exception:
        refused = _refusal(exc)
        if refused is not None:
            return refused
        if _is_unavailable(exc):
            return ServerBusyError(
                f"{self.protocol}://{self.address} unavailable after {self.retries + 1} tries: {exc}"
            )
        if _no_answer(exc):
            return ServerBusyError(
                f"{self.protocol}://{self.address} gave no answer ({type(exc).__name__}: {exc}); the request may "
                "have run, so it was not sent again"
            )
        return exc if isinstance(exc, Exception) else RuntimeError(str(exc))

    def not_served(self, exc: BaseException, stats: Any) -> BaseException:
        """``exc`` as it is, unless the server said "unknown model" and the models it runs (``stats``, its inference
        statistics, or the exception that asking for them raised) lack this one: then :class:`ModelNotServedError`,
        not retried. A server that runs no model at all is starting or draining: unavailable, retried."""
        if not _unknown_model(exc) or isinstance(stats, BaseException):
            return exc  # a server too busy to answer: unavailable, retried
        names = _served(stats)
        if not names or self.model is None or self.model in names:
            return exc  # starting, draining, or still loading this one: unavailable, retried
        return ModelNotServedError(
            f"{self.protocol}://{self.address} does not serve a model {self.model!r}; it serves {', '.join(names)}"
        )

    def probe_failure(self, exc: BaseException, bound: float) -> BaseException:
        """The error of a first contact that failed: no answer in time says so (an address that takes connections
        is not enough); anything else (refused, unavailable) goes on as the request's own error."""
        timed_out = isinstance(exc, (TimeoutError, asyncio.TimeoutError))
        if timed_out or _status(exc) == "StatusCode.DEADLINE_EXCEEDED":
            return ServerBusyError(
                f"{self.protocol}://{self.address} took the connection but did not answer in {bound:g} s: is it "
                "edgecap serve (or Triton) on that port?"
            )
        return exc

    def only_model(self, stats: Any) -> str:
        """The one model in the server's statistics (``edgecap serve`` closes the repository index to clients)."""
        models: Iterable[Any] = stats["model_stats"] if isinstance(stats, dict) else stats.model_stats
        names = sorted({(m["name"] if isinstance(m, dict) else m.name) for m in models})
        if not names:  # loading or draining: the same as a refusal before running, so it is retried
            raise ServerBusyError(f"{self.protocol}://{self.address} serves no model now (starting or draining)")
        if len(names) != 1:
            raise ValueError(f"the server has {len(names)} models {names}: name one (model=...)")
        return names[0]


class CaptionClient:
    """A blocking client. Safe to share between threads (each thread gets its own connection).

    Args:
        url: ``http://HOST:PORT`` (default port 8000) or ``grpc://HOST:PORT`` (8001).
        model: the model (bundle) name; None = the server's only model.
        timeout_s: per-call limit, seconds.
        retries: extra tries when the server is UNAVAILABLE (starting, draining, queue full).
        backoff_s: first retry delay, doubled at each retry.
        token: the token of a server started with ``$EDGECAP_SERVE_TOKEN``, sent with every call.
    """

    def __init__(
        self,
        url: str,
        model: str | None = None,
        *,
        timeout_s: float = 30.0,
        retries: int = 2,
        backoff_s: float = 0.05,
        token: str | None = None,
    ) -> None:
        self._settings = _Settings(url, model, timeout_s, retries, backoff_s, token)
        self._module = _module(self._settings.protocol)
        self._local = threading.local()
        self._contact = threading.Lock()
        self._live = False

    def _client(self) -> Any:
        client = getattr(self._local, "client", None)
        if client is None:
            settings = self._settings
            if settings.protocol == "grpc":
                client = self._module.InferenceServerClient(settings.address)
            else:
                client = self._module.InferenceServerClient(
                    settings.address,
                    connection_timeout=min(settings.timeout_s, CONNECT_TIMEOUT_S),
                    network_timeout=settings.timeout_s,
                )
            self._local.client = client
        return client

    def _first_contact(self) -> None:
        """Once per client: the server answers its liveness within :data:`CONNECT_TIMEOUT_S` (see the module)."""
        if self._live:
            return
        with self._contact:
            if self._live:
                return
            settings = self._settings
            bound = min(settings.timeout_s, CONNECT_TIMEOUT_S)
            if settings.protocol == "grpc":
                probe = self._module.InferenceServerClient(settings.address)
                ask: dict[str, float] = {"client_timeout": bound}
            else:
                probe = self._module.InferenceServerClient(
                    settings.address, connection_timeout=bound, network_timeout=bound
                )
                ask = {}
            try:
                probe.is_server_live(**ask)
            except Exception as exc:
                failure = settings.probe_failure(exc, bound)
                if failure is exc:
                    raise
                raise failure from exc
            finally:
                probe.close()
            self._live = True

    def _checked(self, exc: BaseException) -> BaseException:
        if not _unknown_model(exc):
            return exc
        try:
            stats: Any = self._client().get_inference_statistics(headers=self._settings.headers)
        except Exception as failed:
            stats = failed
        return self._settings.not_served(exc, stats)

    @property
    def model(self) -> str:
        if self._settings.model is None:
            stats = self._client().get_inference_statistics(headers=self._settings.headers)
            self._settings.model = self._settings.only_model(stats)
        return self._settings.model

    def caption(self, image: Any, *, length_level: int | None = None, beam: int | None = None) -> str:
        """The caption of one image (a path, encoded bytes, a PIL image or an H×W×3 uint8 array)."""
        return self.caption_result(image, length_level=length_level, beam=beam).caption

    def caption_result(
        self, image: Any, *, length_level: int | None = None, beam: int | None = None, details: bool = False
    ) -> CaptionReply:
        """The caption, and with ``details`` its token ids and score."""
        inputs, outputs = _request(self._module, image, length_level, beam, details)
        settings = self._settings
        for attempt in range(settings.retries + 1):
            try:
                self._first_contact()
                return _reply(self._client().infer(self.model, inputs, outputs=outputs, **settings.extra()), details)
            except Exception as exc:
                time.sleep(settings.retry_after(self._checked(exc), attempt))
        raise AssertionError("unreachable: the last attempt raises")

    def caption_many(
        self, images: Sequence[Any], *, concurrency: int = 8, **options: Any
    ) -> list[CaptionReply | Exception]:
        """Replies for many images, ``concurrency`` requests in flight; a failed image's slot holds its error."""

        def one(image: Any) -> CaptionReply | Exception:
            try:
                return self.caption_result(image, **options)
            except Exception as exc:
                return exc

        with ThreadPoolExecutor(max(1, concurrency)) as pool:
            return list(pool.map(one, images))

    def close(self) -> None:
        client = getattr(self._local, "client", None)
        if client is not None:
            client.close()
            self._local.client = None

    def __enter__(self) -> CaptionClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncCaptionClient:
    """The asyncio client: the same calls as :class:`CaptionClient`, awaited (``async with`` closes it)."""

    def __init__(
        self,
        url: str,
        model: str | None = None,
        *,
        timeout_s: float = 30.0,
        retries: int = 2,
        backoff_s: float = 0.05,
        token: str | None = None,
    ) -> None:
        self._settings = _Settings(url, model, timeout_s, retries, backoff_s, token)
        self._module = _module(self._settings.protocol, asynchronous=True)
        self._request_module = _module(self._settings.protocol)  # InferInput & co. are shared with the sync API
        if self._settings.protocol == "grpc":
            self._client = self._module.InferenceServerClient(self._settings.address)
        else:
            self._client = self._module.InferenceServerClient(self._settings.address, conn_timeout=timeout_s)
        self._live = False

    async def _first_contact(self) -> None:
        """Once per client: the server answers its liveness within :data:`CONNECT_TIMEOUT_S` (see the module)."""
        if self._live:
            return
        bound = min(self._settings.timeout_s, CONNECT_TIMEOUT_S)
        try:
            await asyncio.wait_for(self._client.is_server_live(), bound)
        except Exception as exc:
            failure = self._settings.probe_failure(exc, bound)
            if failure is exc:
                raise
            raise failure from exc
        self._live = True

    async def _checked(self, exc: BaseException) -> BaseException:
        if not _unknown_model(exc):
            return exc
        try:
            stats: Any = await self._client.get_inference_statistics(headers=self._settings.headers)
        except Exception as failed:
            stats = failed
        return self._settings.not_served(exc, stats)

    async def model(self) -> str:
        if self._settings.model is None:
            stats = await self._client.get_inference_statistics(headers=self._settings.headers)
            self._settings.model = self._settings.only_model(stats)
        return self._settings.model

    async def caption(self, image: Any, *, length_level: int | None = None, beam: int | None = None) -> str:
        return (await self.caption_result(image, length_level=length_level, beam=beam)).caption

    async def caption_result(
        self, image: Any, *, length_level: int | None = None, beam: int | None = None, details: bool = False
    ) -> CaptionReply:
        inputs, outputs = _request(self._request_module, image, length_level, beam, details)
        settings = self._settings
        for attempt in range(settings.retries + 1):
            try:
                await self._first_contact()
                call = self._client.infer(await self.model(), inputs, outputs=outputs, **settings.extra())
                return _reply(await asyncio.wait_for(call, settings.timeout_s), details)
            except Exception as exc:
                await asyncio.sleep(settings.retry_after(await self._checked(exc), attempt))
        raise AssertionError("unreachable: the last attempt raises")

    async def caption_many(
        self, images: Sequence[Any], *, concurrency: int = 8, **options: Any
    ) -> list[CaptionReply | Exception]:
        limit = asyncio.Semaphore(max(1, concurrency))

        async def one(image: Any) -> CaptionReply | Exception:
            async with limit:
                try:
                    return await self.caption_result(image, **options)
                except Exception as exc:
                    return exc

        return list(await asyncio.gather(*(one(image) for image in images)))

    async def close(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> AsyncCaptionClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
