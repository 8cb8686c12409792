"""One worker process of a collection run: its own ``Captioner``, chunks of paths in, journal lines out.

It runs in its own interpreter (:func:`main`, started by :mod:`edgecap.runtime.collections.pool`), talking over two
pipes. It encodes its own lines, so the parent only writes bytes. A bad image becomes an error line, never an error
of the run; anything else (the model failing) stops this worker with a message the parent reports. It exits when the
parent dies (the kernel kills it on Linux; elsewhere its next read or write fails), so a killed run leaves no worker
captioning for no one.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
import warnings
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from edgecap.runtime.collections.journal import record_line

__all__ = ["WorkerSpec", "caption_chunk", "main", "serve"]


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker loads and how it captions (picklable: it crosses to the spawned process).

    ``load`` is the keyword arguments of ``Captioner.load`` besides the bundle (runtime, precision, beam, threads,
    ...); ``cpus`` pins the worker to those CPUs (its share of the cores), None leaves its affinity alone.
    """

    bundle: str
    load: dict[str, Any] = field(default_factory=dict)
    length_level: int | None = None
    batch_size: int = 16
    cpus: tuple[int, ...] | None = None


def caption_chunk(captioner: Any, paths: list[str], spec: WorkerSpec) -> tuple[bytes, int]:
    """The journal lines of ``paths`` (in their order) and how many are errors."""
    from edgecap.runtime.captioner import SkippedImageWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SkippedImageWarning)
        replies = captioner.caption(paths, batch_size=spec.batch_size, length_level=spec.length_level, errors="skip")
    captions = [None if reply is None else reply.text for reply in replies]
    reasons: dict[int, str] = {}
    for warning in caught:
        if isinstance(warning.message, SkippedImageWarning):
            reasons[warning.message.index] = str(warning.message.error)
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    lines = []
    for i, (path, text) in enumerate(zip(paths, captions, strict=True)):
        if text is None:
            lines.append(record_line(path, error=reasons.get(i, f"{path}: not captioned")))
        else:
            lines.append(record_line(path, text))
    return b"".join(lines), sum(text is None for text in captions)


def _die_with_parent() -> None:
    """Linux: have the kernel kill this process when its parent dies (else it notices at its next read)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _read_tasks(tasks: Connection, into: queue.Queue) -> None:
    """Drain the task pipe as tasks arrive, so the parent's sends never wait on a worker busy sending its lines;
    the end of the pipe (the parent stopped or died) ends the queue."""
    try:
        while True:
            into.put(tasks.recv())
    except (EOFError, OSError):
        into.put(None)


def serve(index: int, spec: WorkerSpec, tasks: Connection, results: Connection) -> None:
    """Load, say ``ready``, then caption ``(chunk id, paths)`` tasks until a None or the pipe's end; every outcome
    goes to ``results``: ``("ready", index, summary)``, ``("done", chunk id, lines, errors)`` or
    ``("failed", index, message)``."""
    if spec.cpus is not None and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, spec.cpus)
    from edgecap.runtime.captioner import Captioner

    try:
        captioner = Captioner.load(spec.bundle, **spec.load)
    except Exception as exc:  # any failure to load is this worker's message to the user
        results.send(("failed", index, f"worker {index} could not load {spec.bundle}: {exc}"))
        return
    results.send(("ready", index, captioner.runtime_info.get("summary", "")))
    pending: queue.Queue = queue.Queue()
    threading.Thread(target=_read_tasks, args=(tasks, pending), daemon=True).start()
    with captioner:
        while (task := pending.get()) is not None:
            chunk, paths = task
            try:
                lines, errors = caption_chunk(captioner, paths, spec)
            except Exception as exc:  # not an image's fault (those are error lines): the run cannot go on
                results.send(("failed", index, f"worker {index} failed on {paths[0]}: {type(exc).__name__}: {exc}"))
                return
            results.send(("done", chunk, lines, errors))


def main(argv: list[str] | None = None) -> int:
    """The pool's worker process, reading tasks from ``TASK_FD`` and writing results to ``RESULT_FD`` (its args).

    A fresh interpreter, not ``multiprocessing``: no fork after ONNX Runtime's threads exist, and no re-import of the
    parent's ``__main__`` (which ``spawn`` does, running an unguarded script's code once more in every worker).
    """
    task_fd, result_fd = (int(a) for a in (argv if argv is not None else sys.argv[1:]))
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the workers
    tasks, results = Connection(task_fd, writable=False), Connection(result_fd, readable=False)
    try:
        index, spec = tasks.recv()
        serve(index, spec, tasks, results)
    except (EOFError, BrokenPipeError):  # the parent is gone: nobody reads what this worker would say
        return 1
    return 0
