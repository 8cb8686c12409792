"""Caption image collections of any size into a JSONL file: a streamed listing, worker processes, resumable output.

``edgecap caption DIR --recursive --out captions.jsonl [--resume] [--workers N]`` runs :func:`caption_collection`;
``docs/collections.md`` is the user's page. Each module has one job: :mod:`.listing` (the sorted, streamed walk),
:mod:`.journal` (atomic appends, locking, resume), :mod:`.worker` and :mod:`.pool` (the processes), :mod:`.progress`
(the stderr line) and :mod:`.run` (putting them together).
"""

from __future__ import annotations

from edgecap.runtime.collections.journal import Journal, JournalError, record_line
from edgecap.runtime.collections.listing import Collection, CollectionError
from edgecap.runtime.collections.pool import WorkerError, split_threads
from edgecap.runtime.collections.run import RunSummary, caption_collection
from edgecap.runtime.collections.worker import WorkerSpec

__all__ = [
    "Collection",
    "CollectionError",
    "Journal",
    "JournalError",
    "RunSummary",
    "WorkerError",
    "WorkerSpec",
    "caption_collection",
    "record_line",
    "split_threads",
]
