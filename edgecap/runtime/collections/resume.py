"""Resuming a collection's JSONL output: the whole file is read, so a damaged line costs its image one more caption,
never its caption.

A journal is written in listing order (:mod:`edgecap.runtime.collections.run`), so one pass over its lines beside
one pass over the listing finds, in O(1) memory besides them, every image listed before its last record that has no
record: the image of a damaged line (garbage, a line cut short in the middle, a record out of order), or an image
added since. Those are captioned again and merged into the file at their places (:func:`repair`, one rename), the
damaged lines dropped; then the run goes on after the last record, as before. A partial *last* line is what a killed
writer leaves: :meth:`Journal.open` cuts it off and nothing is said.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator
from dataclasses import dataclass

from edgecap.runtime.collections.journal import Journal, JournalError
from edgecap.runtime.collections.listing import Collection, CollectionError, Key

__all__ = ["ResumePoint", "repair", "resume_point"]

#: Damaged line numbers named in the notice; more are counted.
_SHOWN = 5


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run stands: the key of the last record (None: from the start), the numbers of the lines that
    are not records (dropped by :func:`repair`) and the images before ``last`` that have no record, in listing
    order (captioned again)."""

    last: Key | None = None
    damaged: tuple[int, ...] = ()
    redo: tuple[str, ...] = ()

    def notice(self, out: object) -> str:
        """One line for the user about the repair ahead; empty when the file is whole."""
        said = []
        if self.damaged:
            numbers = ", ".join(str(n) for n in self.damaged[:_SHOWN]) + (" …" if len(self.damaged) > _SHOWN else "")
            said.append(f"{len(self.damaged):,} damaged line(s) (line {numbers}) dropped")
        if self.redo:
            said.append(f"{len(self.redo):,} image(s) before its last line had no line: captioned again")
        return f"resuming {out}: " + "; ".join(said) if said else ""


def resume_point(journal: Journal, collection: Collection) -> ResumePoint:
    """Read ``journal`` whole beside the listing of ``collection`` (see the module).

    Raises:
        CollectionError: a record names a path that is not an image of ``collection`` (the file was written for
            other sources or another --recursive choice); the message names the line.
        JournalError: no line of the file is a caption record.
    """
    listing = iter(collection)
    pending = next(listing, None)
    last: Key | None = None
    damaged: list[int] = []
    redo: list[str] = []
    for number, _, record in journal.records():
        if record is None:
            damaged.append(number)
            continue
        try:
            key = collection.key(record["path"])
        except CollectionError as exc:
            raise CollectionError(f"{journal.path} line {number}: {exc}") from None
        if last is not None and key <= last:  # out of listing order (or twice): not a line this run wrote there
            damaged.append(number)
            continue
        last = key
        while pending is not None and pending[0] < key:
            redo.append(pending[1])
            pending = next(listing, None)
        if pending is not None and pending[0] == key:
            pending = next(listing, None)
    if last is None and damaged:
        raise JournalError(f"{journal.path} has no caption record in {len(damaged):,} line(s): not an output to resume")
    return ResumePoint(last, tuple(damaged), tuple(redo))


def repair(journal: Journal, collection: Collection, redone: bytes) -> None:
    """Rewrite ``journal`` in one rename: its records and the lines ``redone`` (the images of
    :attr:`ResumePoint.redo`, in order) merged in listing order, damaged and out-of-order lines dropped."""

    def kept() -> Iterator[tuple[Key, bytes]]:
        last: Key | None = None
        for _, line, record in journal.records():
            if record is None:
                continue
            key = collection.key(record["path"])
            if last is None or key > last:
                last = key
                yield key, line

    def new() -> Iterator[tuple[Key, bytes]]:
        for line in redone.splitlines(keepends=True):
            yield collection.key(json.loads(line)["path"]), line

    merged = heapq.merge(kept(), new(), key=lambda item: item[0])
    journal.replace(line for _, line in merged)
