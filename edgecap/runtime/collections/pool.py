"""Worker processes for a collection run: start them with their share of the threads, hand out chunks, collect
lines, and turn a worker that dies into an error instead of a wait that never ends.

Each worker is a fresh interpreter (``subprocess``, never ``fork``: a child forked after ONNX Runtime's thread pools
exist can deadlock, and ``multiprocessing``'s spawn re-imports the caller's ``__main__``), with one pipe for tasks and
one for results. Each loads its own ``Captioner``; the parent never loads one, so its memory is the listing's and the
chunks in flight. A worker that dies closes its result pipe: the parent sees the end of it at once, no polling.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from edgecap.runtime.collections.worker import WorkerSpec

__all__ = ["WorkerError", "WorkerPool", "split_threads"]

#: Seconds a worker gets to exit after its last task before it is killed.
_JOIN_SECONDS = 10.0
_RESUME = "the lines written are complete: --resume continues"
#: What each worker runs (its two pipe descriptors follow as arguments).
_WORKER = "import sys; from edgecap.runtime.collections.worker import main; sys.exit(main())"
#: The directory that holds the ``edgecap`` package, put first on the workers' path (a source checkout works too).
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])


class WorkerError(RuntimeError):
    """A worker could not load its captioner, failed on a chunk, or died."""


def _cpus() -> list[int] | None:
    getaffinity = getattr(os, "sched_getaffinity", None)
    return sorted(getaffinity(0)) if getaffinity is not None else None


def split_threads(
    threads: int | str, workers: int, cpus: Sequence[int] | None = None
) -> list[tuple[int | str, tuple[int, ...] | None]]:
    """Each worker's ``threads`` value and CPUs: one budget shared, not one per worker.

    A count ``N >= 1`` is split (``N // workers`` each, the remainder to the first ones, at least 1); ``0`` (ONNX
    Runtime's own default) and a policy (``auto``, ``dedicated``) are kept, and with more than one worker each is
    pinned to its share of the CPUs this process may use, so the policy sizes its threads for that share instead of
    every worker planning for the whole machine. ``cpus``: the CPUs to share (default this process's affinity; None
    where the platform cannot pin, and then nothing is pinned).
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers == 1:
        return [(threads, None)]
    cpus = list(cpus) if cpus is not None else _cpus()
    out: list[tuple[int | str, tuple[int, ...] | None]] = []
    for i in range(workers):
        if isinstance(threads, int) and threads > 0:
            share: int | str = max(1, threads // workers + (i < threads % workers))
        else:
            share = threads
        if not cpus:
            pinned = None
        elif len(cpus) >= workers:
            pinned = tuple(cpus[i::workers])
        else:
            pinned = (cpus[i % len(cpus)],)  # more workers than CPUs: they take turns on one each
        out.append((share, pinned))
    return out


class _Worker:
    """One worker process and the parent's ends of its two pipes."""

    def __init__(self, index: int, spec: WorkerSpec) -> None:
        task_read, task_write = os.pipe()
        result_read, result_write = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _WORKER, str(task_read), str(result_write)],
                pass_fds=(task_read, result_write),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        finally:
            os.close(task_read)
            os.close(result_write)
        self.index = index
        self.tasks = Connection(task_write, readable=False)
        self.results = Connection(result_read, writable=False)
        self.outstanding = 0
        self.tasks.send((index, spec))

    def death(self) -> str:
        try:
            code = self.process.wait(_JOIN_SECONDS)
        except subprocess.TimeoutExpired:
            return f"worker {self.index} (pid {self.process.pid}) closed its pipe"
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        oom = " (out of memory?)" if code == -9 else ""
        return f"worker {self.index} (pid {self.process.pid}) {how}{oom}; " + _RESUME

    def stop(self, graceful: bool) -> None:
        """Wait for it to exit once its task pipe is closed (``graceful``), else kill it; close the pipes."""
        if graceful:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(_JOIN_SECONDS)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for end in (self.tasks, self.results):
            if not end.closed:
                end.close()


class WorkerPool:
    """``workers`` processes captioning chunks; use as a context manager (workers are always stopped on exit)."""

    def __init__(self, spec: WorkerSpec, workers: int) -> None:
        threads = spec.load.get("threads", "auto")
        self._specs = [
            replace(spec, load={**spec.load, "threads": share}, cpus=cpus)
            for share, cpus in split_threads(threads, workers)
        ]
        self._workers: list[_Worker] = []
        self._messages: deque[tuple[_Worker, tuple[Any, ...]]] = deque()
        self.summary = ""

    def __enter__(self) -> WorkerPool:
        try:
            for i, spec in enumerate(self._specs):
                self._workers.append(_Worker(i, spec))
        except BaseException:
            self.close(graceful=False)
            raise
        return self

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        self.close(graceful=exc is None)

    def wait_ready(self) -> str:
        """Wait until every worker has loaded its captioner; returns the first one's runtime summary.

        Raises:
            WorkerError: a worker could not load (its message), or died while loading.
        """
        for _ in self._workers:
            _, message = self._next()
            if message[0] != "ready":
                raise WorkerError(f"a worker answered {message[0]!r} before it was ready")
            self.summary = self.summary or message[2]
        return self.summary

    def submit(self, chunk: int, paths: list[str]) -> None:
        """Give chunk ``chunk`` to the worker with the fewest chunks outstanding."""
        worker = min(self._workers, key=lambda w: w.outstanding)
        try:
            worker.tasks.send((chunk, paths))
        except OSError:
            raise WorkerError(worker.death()) from None
        worker.outstanding += 1

    def result(self) -> tuple[int, bytes, int]:
        """The next finished chunk: ``(chunk id, its journal lines, how many of them are errors)``, in the order the
        workers finish them."""
        worker, message = self._next()
        worker.outstanding -= 1
        return message[1], message[2], message[3]

    def _next(self) -> tuple[_Worker, tuple[Any, ...]]:
        while not self._messages:
            by_pipe = {w.results: w for w in self._workers}
            for pipe in wait(list(by_pipe)):
                worker = by_pipe[pipe]  # type: ignore[index]
                try:
                    self._messages.append((worker, worker.results.recv()))
                except (EOFError, OSError):
                    raise WorkerError(worker.death()) from None
        worker, message = self._messages.popleft()
        if message[0] == "failed":
            raise WorkerError(message[2])
        return worker, message

    def close(self, graceful: bool = True) -> None:
        """Stop the workers: each finishes its chunk and exits (``graceful``), or is killed at once."""
        if graceful:
            for worker in self._workers:
                worker.tasks.close()  # the end of its task pipe: it finishes its chunk and exits
        for worker in self._workers:
            worker.stop(graceful)
