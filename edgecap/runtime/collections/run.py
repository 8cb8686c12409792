"""Caption a collection into a JSONL journal: list, hand chunks to the workers, write their lines in listing order.

Lines are written in the listing's order, whatever order the workers finish in: finished chunks wait in a bounded
window (:data:`WINDOW_PER_WORKER` chunks per worker) until those before them are written. That order is what lets
``resume`` skip everything up to the journal's last line without remembering the paths done
(:mod:`edgecap.runtime.collections.listing`), find the images a damaged line lost
(:mod:`edgecap.runtime.collections.resume`), and what makes ``--workers 2`` write the same file as ``--workers 1``.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO

from edgecap.runtime.collections.journal import Journal
from edgecap.runtime.collections.listing import Collection
from edgecap.runtime.collections.pool import WorkerPool
from edgecap.runtime.collections.progress import Progress
from edgecap.runtime.collections.resume import ResumePoint, repair, resume_point
from edgecap.runtime.collections.worker import WorkerSpec

__all__ = ["CHUNK", "WINDOW_PER_WORKER", "RunSummary", "caption_collection"]

#: Images per chunk a worker captions at a time (``Captioner.batch`` splits it into its batches): large enough that
#: a chunk's hand-off costs nothing next to its captions, small enough that a kill loses little work.
CHUNK = 64
#: Chunks per worker in flight (at a worker, queued, or finished and waiting for an earlier one to be written).
WINDOW_PER_WORKER = 4


@dataclass(frozen=True)
class RunSummary:
    """What a run did: lines written (captions and errors), the errors among them, whether it continued an
    existing file, the workers' runtime (empty when none was started) and the seconds it took, loading included;
    resuming, the damaged lines it dropped and the images among ``written`` captioned again (they had no line)."""

    written: int
    errors: int
    resumed: bool
    runtime: str
    seconds: float
    dropped: int = 0
    redone: int = 0

    def describe(self, out: Path) -> str:
        rate = self.written / self.seconds if self.seconds > 0 else 0.0
        bad = f" ({self.errors:,} could not be read: error lines)" if self.errors else ""
        said = f"wrote {self.written:,} line(s){bad} to {out} in {self.seconds:.1f} s ({rate:.1f} images/s)"
        if self.dropped or self.redone:
            said += f"; {self.dropped:,} damaged line(s) dropped, {self.redone:,} image(s) captioned again"
        return said


class _Sink(Protocol):
    def append(self, data: bytes) -> None: ...


class _Held:
    """The lines of the images captioned again, held until :func:`repair` merges them in."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def append(self, data: bytes) -> None:
        self.parts.append(data)


def _chunks(listing: Iterable[tuple[object, str]], size: int) -> Iterator[list[str]]:
    listing = iter(listing)
    while chunk := [path for _, path in itertools.islice(listing, size)]:
        yield chunk


def _caption(pool: WorkerPool, chunks: Iterator[list[str]], journal: _Sink, bar: Progress, window: int) -> None:
    """Keep ``window`` chunks in flight; append each finished chunk once every chunk before it is written."""
    pending = enumerate(chunks)
    finished: dict[int, bytes] = {}
    submitted = written = 0
    exhausted = False
    while True:
        while not exhausted and submitted - written < window:
            item = next(pending, None)
            if item is None:
                exhausted = True
                break
            pool.submit(*item)
            submitted += 1
        if written == submitted:
            return
        index, lines, errors = pool.result()
        finished[index] = lines
        bar.update(0, errors)
        while written in finished:
            lines = finished.pop(written)
            journal.append(lines)
            bar.update(lines.count(b"\n"))
            written += 1


def caption_collection(
    collection: Collection,
    out: str | Path,
    spec: WorkerSpec,
    *,
    workers: int = 1,
    resume: bool = False,
    chunk: int = CHUNK,
    progress: bool = True,
    stream: TextIO | None = None,
) -> RunSummary:
    """Caption every image of ``collection`` into the JSONL file ``out`` with ``workers`` processes.

    ``out`` is checked and locked before any work (:meth:`Journal.open`); with ``resume`` the images up to its last
    line are skipped. The progress line goes to ``stream`` (default stderr) when ``progress``.

    Raises:
        JournalError: ``out`` exists without ``resume``, is busy, or cannot be written.
        CollectionError: the sources cannot be listed, or ``out`` was started for other sources.
        WorkerError: a worker could not load the bundle, failed, or died; the lines written are complete.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    started = time.monotonic()
    collection = collection.excluding(out)  # the output and its temporary files are never captioned
    with Journal.open(out, resume=resume) as journal:
        point = resume_point(journal, collection) if not journal.created else ResumePoint()
        if point.notice(out):
            print(point.notice(out), file=stream or sys.stderr, flush=True)
        total = len(point.redo) + collection.count(point.last)
        resumed = point.last is not None
        if total == 0:  # everything has its line already (or nothing to caption): no worker to start
            if point.damaged:
                repair(journal, collection, b"")
            return RunSummary(0, 0, resumed, "", time.monotonic() - started, len(point.damaged))
        bar = Progress(total, stream=stream, enabled=progress)
        window = WINDOW_PER_WORKER * workers
        try:
            with WorkerPool(spec, min(workers, -(-total // chunk))) as pool:  # no idle worker loading a model
                summary = pool.wait_ready()
                bar.start()
                if point.damaged or point.redo:
                    held = _Held()
                    _caption(pool, _chunks(((None, p) for p in point.redo), chunk), held, bar, window)
                    repair(journal, collection, b"".join(held.parts))
                _caption(pool, _chunks(collection.after(point.last), chunk), journal, bar, window)
        finally:
            bar.close()  # the last count, and a newline before any error message
    written = journal.lines_written + len(point.redo)
    seconds = time.monotonic() - started
    return RunSummary(written, bar.errors, resumed, summary, seconds, len(point.damaged), len(point.redo))
