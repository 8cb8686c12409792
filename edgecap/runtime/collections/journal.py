"""The JSONL output of a collection run: appended atomically, one writer at a time, resumable after a kill.

One line per image, keys in this order (the record format ``edgecap caption --out`` and the Ray path share)::

    {"path":"photos/a.jpg","caption":"a dog on a beach"}
    {"path":"photos/b.jpg","error":"photos/b.jpg: cannot identify image file"}

Lines are UTF-8 (``ensure_ascii=False``; a path that is not valid UTF-8 is written with ``\\udcXX`` escapes, which
``json.loads`` and ``os.fsencode`` turn back into its bytes). A chunk of lines goes to the file in one ``os.write`` on
an ``O_APPEND`` descriptor, so lines are never interleaved; a writer killed mid-write leaves at most a partial last
line, which :meth:`Journal.open` cuts off when resuming. The file is ``flock``-ed while written: a second writer
fails at once instead of interleaving its lines, and the lock dies with its process (no stale lock files). A resumed
journal is read whole (:mod:`edgecap.runtime.collections.resume`): a damaged line in the middle is found, and
:meth:`Journal.replace` rewrites the file without it in one rename.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import stat
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from edgecap.runtime._io import check_output_location

__all__ = ["FSYNC_SECONDS", "Journal", "JournalError", "record_line"]

#: At most this long between two fsyncs while lines are appended (and one at close): a machine that loses power
#: loses at most this much work, and the tail it leaves is cut off on resume like a killed writer's.
FSYNC_SECONDS = 10.0

_TAIL_BLOCK = 64 * 1024


class JournalError(ValueError):
    """An output that cannot be written or resumed (exists without resume, busy, unreadable, not a journal)."""


def record_line(path: str, caption: str | None = None, error: str | None = None) -> bytes:
    """One journal line (newline included): the caption of ``path``, or why it has none."""
    record: dict[str, Any] = {"path": path}
    if error is not None:
        record["error"] = " ".join(error.split())  # one line, whatever the exception said
    else:
        record["caption"] = caption
    text = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode("utf-8") + b"\n"
    except UnicodeEncodeError:  # a file name that is not UTF-8 (surrogate escapes): JSON escapes keep it exact
        return json.dumps(record, separators=(",", ":")).encode("ascii") + b"\n"


def parse_record(line: bytes) -> dict[str, Any] | None:
    """The record of one journal line, or None for a line that is not one (damaged, or not a journal's)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("path"), str) else None


def _first_line(fd: int) -> bytes:
    head = os.pread(fd, _TAIL_BLOCK, 0)
    return head.split(b"\n", 1)[0]


def _last_line(fd: int, size: int) -> tuple[bytes | None, int]:
    """The last complete line of the file (without its newline) and where complete lines end (the size to keep)."""
    end = size
    tail = b""
    while end > 0:  # read backwards until the last newline, then until the one before it
        start = max(0, end - _TAIL_BLOCK)
        tail = os.pread(fd, end - start, start) + tail
        end = start
        last_nl = tail.rfind(b"\n")
        if last_nl < 0:
            continue
        keep = end + last_nl + 1
        before = tail.rfind(b"\n", 0, last_nl)
        if before >= 0 or end == 0:
            return tail[before + 1 : last_nl], keep
    return None, 0


class Journal:
    """An open journal: :meth:`append` lines, :meth:`close` when done. :attr:`last_path` is the path of the last
    line already in the file when it was opened (None for a new or empty one, or when that line is damaged: a resumed
    run reads the whole file, :func:`edgecap.runtime.collections.resume.resume_point`)."""

    def __init__(self, path: Path, fd: int, created: bool, last_path: str | None, truncated: int) -> None:
        self.path, self.created, self.last_path = path, created, last_path
        self.truncated = truncated  #: bytes of a partial last line cut off when it was opened
        self.lines_written = 0  #: lines appended since it was opened
        self._fd: int | None = fd
        self._synced = time.monotonic()

    @classmethod
    def open(cls, path: str | os.PathLike, resume: bool = False) -> Journal:
        """Open ``path`` for appending, before any work: a new file, or an existing one when ``resume``.

        Raises:
            JournalError: ``path`` exists without ``resume``; another process is writing it; it cannot be created
                or written; neither its first nor its last complete line is a caption record (not a journal).
        """
        path = Path(path)
        if path.is_dir():
            raise JournalError(f"{path} is a directory; --out names the JSONL file to write")
        if path.exists() and not resume:
            raise JournalError(f"{path} already exists: pass --resume to continue it (or choose another --out)")
        try:
            check_output_location(path.parent, existing="into", what="--out", reserve=0)
        except (OSError, ValueError) as exc:  # a read-only place, a file in the way, a name too long
            raise JournalError(str(exc)) from None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
            created = not path.exists()
            fd = os.open(path, flags | os.O_CREAT | (os.O_EXCL if created else 0), 0o666)
        except FileExistsError:
            raise JournalError(f"{path} appeared while opening it: another process is writing it") from None
        except (OSError, ValueError) as exc:
            raise JournalError(f"cannot write {path}: {getattr(exc, 'strerror', None) or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise JournalError(f"{path} is being written by another process; wait for it to finish") from None
            raise JournalError(f"cannot lock {path}: {exc.strerror or exc}") from None
        try:
            last, cut = cls._recover(path, fd)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, created, last, cut)

    @staticmethod
    def _recover(path: Path, fd: int) -> tuple[str | None, int]:
        """Cut a partial last line off (a writer killed mid-line) and read the last complete line's path."""
        size = os.fstat(fd).st_size
        if size == 0:
            return None, 0
        try:
            reader = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise JournalError(f"cannot read {path} to resume it: {exc.strerror or exc}") from None
        try:
            line, keep = _last_line(reader, size)
            first = _first_line(reader)
        finally:
            os.close(reader)
        if line is not None and parse_record(line) is None and parse_record(first) is None:
            # neither end is a record: some other file, refused before anything is cut from it
            raise JournalError(
                f"{path} does not begin or end with a caption record ({line[:60]!r}): not an output to resume"
            )
        if keep < size:
            os.ftruncate(fd, keep)
            os.fsync(fd)
        record = parse_record(line) if line is not None else None
        return (record["path"] if record is not None else None), size - keep

    def records(self) -> Iterator[tuple[int, bytes, dict[str, Any] | None]]:
        """Every line now in the file: ``(line number from 1, the line, its record or None when damaged)``."""
        with open(self.path, "rb") as lines:
            for number, line in enumerate(lines, 1):
                yield number, line, parse_record(line)

    def replace(self, content: Iterable[bytes]) -> None:
        """Make ``content`` (whole lines) the file's content in one rename: written to a locked temporary file
        beside it (``.NAME.*.tmp``; one a killed rewrite left is removed), fsynced, renamed over it; appends go on
        to the new file. A kill at any point leaves the old file or the new one, whole."""
        if self._fd is None:
            raise JournalError(f"{self.path} is closed")
        for stale in self.path.parent.glob(f".{self.path.name}.*.tmp"):
            stale.unlink(missing_ok=True)  # ours: only the lock holder writes them
        tmp = self.path.with_name(f".{self.path.name}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, stat.S_IMODE(os.fstat(self._fd).st_mode))
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            for data in content:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            os.fsync(fd)
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        folder = os.open(self.path.parent, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
        old, self._fd = self._fd, fd
        os.close(old)
        self._synced = time.monotonic()

    def append(self, data: bytes) -> None:
        """Append whole lines (``data`` ends with a newline) in one write: a reader sees all of them or none."""
        if self._fd is None:
            raise JournalError(f"{self.path} is closed")
        if data and not data.endswith(b"\n"):
            raise ValueError("a journal takes whole lines: data must end with a newline")
        view = memoryview(data)
        while view:  # a regular file takes the whole write unless the disk is full (then OSError)
            view = view[os.write(self._fd, view) :]
        self.lines_written += data.count(b"\n")
        if time.monotonic() - self._synced >= FSYNC_SECONDS:
            self.sync()

    def sync(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            self._synced = time.monotonic()

    def close(self, discard_if_empty: bool = False) -> None:
        """fsync and close (releasing the lock). ``discard_if_empty``: remove a file this journal created and never
        wrote to (a run that failed before its first line leaves nothing behind to refuse the next one)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if discard_if_empty and self.created and self.lines_written == 0:
                self.path.unlink(missing_ok=True)  # still locked: no other writer can have taken it meanwhile
            else:
                os.fsync(fd)
        finally:
            os.close(fd)

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        self.close(discard_if_empty=exc is not None)
