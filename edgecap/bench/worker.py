"""Where a group runs: in a fresh Python process (``BenchCfg.isolate``, the default) or in this one.

Why a fresh process per group (bundle × runtime × precision): its resident memory, GPU memory and load time are its
own, not inflated by models an earlier group loaded (allocators rarely give memory back), its ``load_s`` is a cold
start, and a crash or out-of-memory kill in it becomes an error entry while the run goes on.

The worker is a plain subprocess, ``python -m edgecap.bench.worker FD``, not a ``multiprocessing`` spawn: the
caller's ``__main__`` is never re-imported, so a script calling :func:`~edgecap.bench.run.run_benchmark` needs no
``if __name__ == "__main__"`` guard. (Windows, where a socket cannot be handed to a subprocess by number, uses a
``multiprocessing`` spawn process over the same protocol, and so needs the guard.)

Protocol: one duplex :func:`multiprocessing.Pipe` connection (a socket pair) whose child end the worker inherits as
file descriptor ``FD``. Every message is one pickled dataclass, sent with ``Connection.send``:

====================  ==============================================================================================
parent → worker       exactly one :class:`~edgecap.bench.measure.GroupTask`
worker → parent       any number of :class:`Progress` (``start`` before a unit of work, ``done`` after it), then
                      exactly one :class:`Finished` (the :class:`~edgecap.bench.measure.GroupOutcome`) or
                      :class:`Failed` (the exception, with a short traceback); then the worker exits
====================  ==============================================================================================

The connection closing before :class:`Finished`/:class:`Failed` means the worker died (a crash, the OOM killer): the
group becomes an error entry naming the exit code. The worker's stdout goes to stderr, so ``edgecap bench``'s own
output stays the summary.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Literal

from edgecap.bench.measure import Emit, GroupOutcome, GroupTask, error_entry, measure_group
from edgecap.runtime._process import terminate

__all__ = ["Failed", "Finished", "Progress", "WorkerMessage", "run_in_process", "run_isolated", "serve"]


@dataclass(frozen=True)
class Progress:
    """A unit of work (a quality run, a timing run) starts or is done; ``label`` names it for the progress bar."""

    event: Literal["start", "done"]
    label: str


@dataclass(frozen=True)
class Finished:
    """The group ran: its results, and the combinations that failed inside it."""

    outcome: GroupOutcome


@dataclass(frozen=True)
class Failed:
    """The group could not run (e.g. the bundle would not load): the exception and a short traceback."""

    error: str


WorkerMessage = Progress | Finished | Failed


def serve(conn: Connection) -> None:
    """The worker's side: receive one task, measure it, send progress and then the outcome; never raises."""

    def emit(event: str, label: str) -> None:
        conn.send(Progress(event, label))  # type: ignore[arg-type]

    try:
        task = conn.recv()
        if not isinstance(task, GroupTask):
            raise TypeError(f"expected a GroupTask, got {type(task).__name__}")
        message: WorkerMessage = Finished(measure_group(task, emit))
    except BaseException as exc:  # everything goes back to the parent, nothing is lost
        message = Failed(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}")
    try:
        conn.send(message)
    except Exception as exc:  # an outcome that does not pickle: still say why
        conn.send(Failed(f"could not send the outcome: {type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def _main(argv: list[str]) -> int:
    """``python -m edgecap.bench.worker FD``: serve on the inherited connection ``FD``."""
    os.dup2(2, 1)  # native libraries' prints too: stdout is the parent's summary
    sys.stdout = sys.stderr
    serve(Connection(int(argv[0])))
    return 0


class _Worker:
    """A started worker: a subprocess (POSIX) or a spawn ``multiprocessing`` process (Windows), same interface."""

    def __init__(self, child: Connection, spawn: bool) -> None:
        self._process: subprocess.Popen | None = None
        self._spawned: multiprocessing.process.BaseProcess | None = None
        if spawn:
            self._spawned = multiprocessing.get_context("spawn").Process(target=serve, args=(child,), daemon=True)
            self._spawned.start()
            return
        # The worker imports the same edgecap as this process, installed or not (a source checkout on sys.path).
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        fd = child.fileno()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "edgecap.bench.worker", str(fd)], pass_fds=(fd,), env=env
        )

    def wait(self) -> int | None:
        if self._process is not None:
            return self._process.wait()
        assert self._spawned is not None
        self._spawned.join()
        return self._spawned.exitcode

    def stop(self) -> None:
        """Stop the worker if it still runs (this call was interrupted); always reaped on return."""
        if self._process is not None:
            if self._process.poll() is None:
                terminate(self._process, timeout=10)
        elif self._spawned is not None and self._spawned.is_alive():
            self._spawned.terminate()
            self._spawned.join(10)
            if self._spawned.is_alive():
                self._spawned.kill()
                self._spawned.join()


def run_isolated(task: GroupTask, emit: Emit, *, spawn: bool | None = None) -> GroupOutcome:
    """Run :func:`~edgecap.bench.measure.measure_group` in a fresh Python process (the protocol above).

    Args:
        spawn: start the worker with ``multiprocessing``'s spawn instead of a subprocess; None = on Windows only.
    """
    parent, child = multiprocessing.Pipe(duplex=True)
    worker = _Worker(child, spawn=os.name == "nt" if spawn is None else spawn)
    child.close()  # the worker holds the only other end: its exit closes the connection
    try:
        parent.send(task)
        reply = _receive(parent, emit)
        code = worker.wait()
    finally:
        worker.stop()
        parent.close()
    if isinstance(reply, Finished):
        return reply.outcome
    if isinstance(reply, Failed):
        return GroupOutcome(errors=[error_entry(task, reply.error.strip())])
    hint = " (killed: out of memory?)" if code in (-9, 137) else ""
    return GroupOutcome(errors=[error_entry(task, f"worker process exited with code {code}{hint}")])


def _receive(conn: Connection, emit: Callable[[str, str], object]) -> Finished | Failed | None:
    """Pass progress on until the final message; None when the worker died before sending one."""
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return None
        if isinstance(message, Progress):
            emit(message.event, message.label)
        elif isinstance(message, (Finished, Failed)):
            return message
        else:
            return Failed(f"worker sent {type(message).__name__}, not a protocol message")


def run_in_process(task: GroupTask, emit: Emit) -> GroupOutcome:
    """Run the group in this process (``--no-isolate``): a group that cannot load is an error entry, the run goes on."""
    try:
        return measure_group(task, emit)
    except Exception as exc:
        return GroupOutcome(errors=[error_entry(task, f"{type(exc).__name__}: {exc}")])


if __name__ == "__main__":  # the messages must be pickled as edgecap.bench.worker's classes, not __main__'s
    from edgecap.bench.worker import _main

    sys.exit(_main(sys.argv[1:]))
