"""Caption a collection into a JSONL journal: list, hand chunks to the workers, write their lines in listing order.

Lines are written in the listing's order, whatever order the workers finish in: finished chunks wait in a bounded
window (:data:`WINDOW_PER_WORKER` chunks per worker) until those before them are written. That order is what lets
``resume`` skip everything up to the journal's last line without remembering the paths done
(:mod:`edgecap.runtime.collections.listing`), and what makes ``--workers 2`` write the same file as ``--workers 1``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from edgecap.runtime.collections.journal import Journal
from edgecap.runtime.collections.listing import Collection
from edgecap.runtime.collections.pool import WorkerPool
from edgecap.runtime.collections.progress import Progress
from edgecap.runtime.collections.worker import WorkerSpec

__all__ = ["CHUNK", "WINDOW_PER_WORKER", "RunSummary", "caption_collection"]

#: Images per chunk a worker captions at a time (``Captioner.batch`` splits it into its batches): large enough that
#: a chunk's hand-off costs nothing next to its captions, small enough that a kill loses little work.
CHUNK = 64
#: Chunks per worker in flight (at a worker, queued, or finished and waiting for an earlier one to be written).
WINDOW_PER_WORKER = 4


@dataclass(frozen=True)
class RunSummary:
    """What a run did: lines appended (captions and errors), the errors among them, whether it continued an
    existing file, the workers' runtime (empty when none was started) and the seconds it took, loading included."""

    written: int
    errors: int
    resumed: bool
    runtime: str
    seconds: float

    def describe(self, out: Path) -> str:
        rate = self.written / self.seconds if self.seconds > 0 else 0.0
        bad = f" ({self.errors:,} could not be read: error lines)" if self.errors else ""
        return f"wrote {self.written:,} line(s){bad} to {out} in {self.seconds:.1f} s ({rate:.1f} images/s)"


def _chunks(listing: Iterator[tuple[object, str]], size: int) -> Iterator[list[str]]:
    while chunk := [path for _, path in itertools.islice(listing, size)]:
        yield chunk


def _caption(pool: WorkerPool, chunks: Iterator[list[str]], journal: Journal, bar: Progress, window: int) -> None:
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
    with Journal.open(out, resume=resume) as journal:
        last = collection.key(journal.last_path) if journal.last_path is not None else None
        total = collection.count(last)
        if total == 0:  # everything has its line already (or nothing to caption): no worker to start
            return RunSummary(0, 0, last is not None, "", time.monotonic() - started)
        bar = Progress(total, stream=stream, enabled=progress)
        try:
            with WorkerPool(spec, min(workers, -(-total // chunk))) as pool:  # no idle worker loading a model
                summary = pool.wait_ready()
                bar.start()
                _caption(pool, _chunks(collection.after(last), chunk), journal, bar, WINDOW_PER_WORKER * workers)
        finally:
            bar.close()  # the last count, and a newline before any error message
    return RunSummary(journal.lines_written, bar.errors, last is not None, summary, time.monotonic() - started)
