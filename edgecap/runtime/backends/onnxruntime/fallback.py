"""ONNX Runtime dropping a GPU provider it was asked for: caught when the session is created, explained, reported.

When the CUDA or TensorRT provider of an ``onnxruntime-gpu`` build cannot start (its shared library or one it links
is missing: no NVIDIA driver, no TensorRT, CUDA/cuDNN of another major version), ONNX Runtime does not raise. It logs
the library's load error on stderr (its native logger, fd 2), the Python wrapper prints an ``EP Error`` notice on
stdout when TensorRT was first and retries without it, and the session runs on the providers that did start, often
only the CPU. :func:`open_session` creates a session with both streams captured (only when a GPU provider is
requested), compares the providers the session got with those it asked for, and returns a :class:`ProviderFallback`
whose ``cause`` is read from what ONNX Runtime printed, or from loading the provider's library with ``ctypes`` when
it printed nothing. ONNX Runtime's output goes back where it was going when nothing fell back, and to the debug log
when it did (the cause carries its substance), so ``edgecap caption --json`` keeps a clean stdout.

Before the first session that asks for a GPU provider, :func:`preload_gpu_libraries` calls
``onnxruntime.preload_dlls()`` where the build has it (1.21 and newer), so CUDA and cuDNN from NVIDIA's pip packages
(``nvidia-*-cu12``/``nvidia-cu13``, e.g. those torch installs) are found without ``LD_LIBRARY_PATH``. Set
``EDGECAP_ONNXRUNTIME_PRELOAD_DLLS=0`` to leave library loading to ONNX Runtime alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import logging
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgecap.runtime.backends.onnxruntime.providers import CUDA_PROVIDERS, provider_info, provider_label

log = logging.getLogger(__name__)

__all__ = [
    "CapturedOutput",
    "ProviderFallback",
    "ProviderFallbackWarning",
    "capture_output",
    "fallback_cause",
    "open_session",
    "preload_gpu_libraries",
    "provider_library_error",
]


class ProviderFallbackWarning(RuntimeWarning):
    """ONNX Runtime runs a session without a provider it was asked for (e.g. on the CPU instead of CUDA)."""


@dataclass(frozen=True)
class ProviderFallback:
    """Providers a session asked for and did not get.

    Attributes:
        requested: the providers asked for, in priority order.
        in_use: what the session runs on (``InferenceSession.get_providers()``).
        cause: why the missing ones did not start, as ONNX Runtime (or loading their library) said.
    """

    requested: tuple[str, ...]
    in_use: tuple[str, ...]
    cause: str

    @property
    def dropped(self) -> tuple[str, ...]:
        """The requested providers that are not running."""
        return tuple(p for p in self.requested if p not in self.in_use)

    @property
    def primary_changed(self) -> bool:
        """The provider that runs the graph first is not the one asked for first (a re-plan is due)."""
        return bool(self.in_use) and self.in_use[0] != self.requested[0]

    def as_dict(self) -> dict[str, Any]:
        """``runtime_info["provider_fallback"]``: ``requested``, ``in_use``, ``cause``."""
        return {"requested": list(self.requested), "in_use": list(self.in_use), "cause": self.cause}

    def describe(self) -> str:
        """One line: where it runs, what did not start, and why."""
        where = provider_label(self.in_use[0]) if self.in_use else "no provider"
        missing = ", ".join(provider_label(p) for p in self.dropped)
        return f"running on {where}: {missing} did not start ({self.cause})"


@dataclass
class CapturedOutput:
    """What was written to fd 2 and to ``sys.stdout`` while :func:`capture_output` was active."""

    stderr: str = ""
    stdout: str = ""

    @property
    def text(self) -> str:
        return "\n".join(t for t in (self.stderr, self.stdout) if t)


#: fd 2 and ``sys.stdout`` are process-wide: one capture at a time, or a nested one would restore the wrong target.
_CAPTURE_LOCK = threading.RLock()
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@contextlib.contextmanager
def capture_output() -> Iterator[CapturedOutput]:
    """Capture fd 2 (native libraries' logs) and ``sys.stdout`` (Python prints); the text is in the yielded object
    once the block exits. Nothing is written back: the caller decides (see :func:`open_session`)."""
    captured = CapturedOutput()
    with _CAPTURE_LOCK, tempfile.TemporaryFile() as spool:
        stdout = io.StringIO()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        try:
            saved = os.dup(2)
        except OSError:  # no fd 2 at all (a daemon): only the Python-level stream is captured
            saved = None
        try:
            if saved is not None:
                os.dup2(spool.fileno(), 2)
            with contextlib.redirect_stdout(stdout):
                yield captured
        finally:
            if saved is not None:
                os.dup2(saved, 2)
                os.close(saved)
            spool.seek(0)
            captured.stderr = spool.read().decode("utf-8", errors="replace")
            captured.stdout = stdout.getvalue()


def _emit(captured: CapturedOutput) -> None:
    """Write captured output back where it was going."""
    if captured.stderr:
        with contextlib.suppress(OSError):
            os.write(2, captured.stderr.encode("utf-8", errors="replace"))
    if captured.stdout:
        sys.stdout.write(captured.stdout)


_PRELOAD_LOCK = threading.Lock()
_preloaded = False
#: The environment variable that turns the preload off (``0``).
PRELOAD_ENV = "EDGECAP_ONNXRUNTIME_PRELOAD_DLLS"


def preload_gpu_libraries(onnxruntime: Any) -> None:
    """``onnxruntime.preload_dlls()`` once per process, where this build has it: CUDA and cuDNN from NVIDIA's pip
    packages become loadable by the CUDA/TensorRT providers. What it prints (a library it could not find) goes to the
    debug log; a failure is logged and ignored (ONNX Runtime then searches the usual library paths itself)."""
    global _preloaded
    preload = getattr(onnxruntime, "preload_dlls", None)
    if not callable(preload) or os.environ.get(PRELOAD_ENV, "1") == "0":
        return
    with _PRELOAD_LOCK:
        if _preloaded:
            return
        _preloaded = True
        with capture_output() as captured:
            try:
                preload()
            except Exception as exc:  # a broken NVIDIA package must not stop a CPU fallback
                log.debug("onnxruntime.preload_dlls() failed: %s", exc)
        if captured.text.strip():
            log.debug("onnxruntime.preload_dlls():\n%s", _ANSI.sub("", captured.text).strip())


def open_session(
    onnxruntime: Any, source: Any, options: Any, entries: Sequence[tuple[str, Any]]
) -> tuple[Any, ProviderFallback | None]:
    """An ``InferenceSession`` on ``entries`` (``(provider, options)`` pairs), and a :class:`ProviderFallback` when it
    runs without some of them (else None).

    With a GPU provider among ``entries`` its libraries are preloaded first and ONNX Runtime's output during creation
    is captured: written back when every provider started (or when creation raised), kept for the debug log when one
    did not, its cause then in the fallback.

    Raises:
        Exception: what ``InferenceSession`` raised, unchanged.
    """
    requested = tuple(name for name, _ in entries)
    if not any(name in CUDA_PROVIDERS for name in requested):
        return onnxruntime.InferenceSession(source, options, providers=list(entries)), None
    preload_gpu_libraries(onnxruntime)
    captured = CapturedOutput()
    try:
        with capture_output() as captured:
            session = onnxruntime.InferenceSession(source, options, providers=list(entries))
    except BaseException:
        _emit(captured)  # the caller reports the error; what ONNX Runtime printed about it stays visible
        raise
    in_use = tuple(session.get_providers())
    if all(p in in_use for p in requested):
        _emit(captured)
        return session, None
    text = _ANSI.sub("", captured.text)
    if text.strip():
        log.debug("ONNX Runtime's output while creating the session:\n%s", text.strip())
    dropped = [p for p in requested if p not in in_use]
    return session, ProviderFallback(requested, in_use, fallback_cause(text, dropped, onnxruntime))


# -- why a provider did not start ------------------------------------------------------------------------------------
#: ``Failed to load library …/libonnxruntime_providers_cuda.so with error: libcublasLt.so.13: cannot open …``
_LOAD_ERROR = re.compile(
    r"Failed to load library \S*?(?:lib)?onnxruntime_providers_(\w+)\.(?:so|dll|dylib)\S* with error: (.+)"
)
#: ``Failed to create CUDAExecutionProvider. Require cuDNN 9.* and CUDA 13.* …``
_CREATE_ERROR = re.compile(r"Failed to create (\w+ExecutionProvider)\.? ?(.*)")
#: The Python wrapper's notice when a provider raised: ``EP Error <message> when using [...]``.
_EP_ERROR = re.compile(r"^EP Error:? (?!\*)(.+?)\s+(?:when )?using \[", re.S | re.M)
#: Any error record of ONNX Runtime's logger: ``… [E:onnxruntime:Default, file.cc:12 fn] message``.
_ERROR_RECORD = re.compile(r"\[E:onnxruntime:[^\]]*\]\s*(.+)")
#: What a missing library means, for the one-line cause (matched against the load error).
_MISSING_MEANS = (
    ("libcuda.so", "no NVIDIA driver"),
    ("nvcuda.dll", "no NVIDIA driver"),
    ("libnvinfer", "TensorRT is not installed"),
    ("nvinfer", "TensorRT is not installed"),
    ("libcudnn", "cuDNN is not installed"),
    ("libcublas", "the CUDA libraries are not installed"),
    ("libcudart", "the CUDA libraries are not installed"),
    ("libcurand", "the CUDA libraries are not installed"),
    ("libcufft", "the CUDA libraries are not installed"),
)


def _tidy(message: str) -> str:
    """ONNX Runtime's message without its source location, C++ signature and status prefix."""
    message = message.strip()
    message = re.sub(r".*\[ONNXRuntimeError\] : \d+ : \w+ : ", "", message)
    message = re.sub(r"^\S+\.(?:cc|h|cpp):\d+ [^(]*\([^)]*\)\s*", "", message)
    return " ".join(message.split())


def _explained(error: str) -> str:
    why = next((means for lib, means in _MISSING_MEANS if lib in error and "cannot open" in error), None)
    return f"{why}: {error}" if why else error


def fallback_cause(text: str, dropped: Sequence[str], onnxruntime: Any = None) -> str:
    """Why each of ``dropped`` did not start, one clause per provider (``"TensorRT: TensorRT is not installed:
    libnvinfer.so.10: cannot open shared object file …; CUDA: no NVIDIA driver: libcuda.so.1: …"``), read from
    ONNX Runtime's output ``text``; for a provider it said nothing about, the error loading its library (the
    ``onnxruntime`` module given), else that no reason was given."""
    loads = {m.group(1).lower(): _tidy(m.group(2)) for m in _LOAD_ERROR.finditer(text)}
    creates = {m.group(1): _tidy(m.group(2)) for m in _CREATE_ERROR.finditer(text)}
    ep_errors = [_tidy(m.group(1)) for m in _EP_ERROR.finditer(text)]
    records = [_tidy(m.group(1)) for m in _ERROR_RECORD.finditer(text)]
    clauses = []
    for provider in dropped:
        info = provider_info(provider)
        library = (info.library or "") if info is not None else ""
        label = provider_label(provider)
        if library and library in loads:
            why = _explained(loads[library])
        elif provider in creates and creates[provider]:
            why = creates[provider]
        else:
            mentioned = [e for e in (*ep_errors, *records) if label.lower() in e.lower()]
            probed = (
                provider_library_error(onnxruntime, provider) if onnxruntime is not None and not mentioned else None
            )
            if mentioned:
                why = mentioned[0]
            elif probed:
                why = _explained(probed)
            else:
                why = "ONNX Runtime gave no reason"
        clauses.append(f"{label}: {why}")
    return "; ".join(clauses) or "ONNX Runtime gave no reason"


def provider_library_error(onnxruntime: Any, provider: str) -> str | None:
    """The error loading ``provider``'s shared library from the onnxruntime package (what the dynamic loader says is
    missing), or None when it loads, has no library of its own, or is not in this package."""
    info = provider_info(provider)
    if info is None or info.library is None:
        return None
    capi = Path(getattr(onnxruntime, "__file__", "") or ".").parent / "capi"
    names = (f"libonnxruntime_providers_{info.library}.so", f"onnxruntime_providers_{info.library}.dll")
    path = next((capi / n for n in names if (capi / n).is_file()), None)
    if path is None:
        return None
    try:
        ctypes.CDLL(str(path))
    except OSError as exc:
        return f"{path.name}: {exc}"
    return None
