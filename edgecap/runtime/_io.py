"""Atomic file writes: a reader never sees a half-written file, a crash never leaves one."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal


def _umask() -> int:
    # Linux reports the umask without changing it; elsewhere it is read by setting and restoring it.
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _apply_default_mode(path: Path, mode: int) -> None:
    # mkstemp/mkdtemp create private (0600/0700) entries; give outputs the usual umask-based permissions.
    os.chmod(path, mode & ~_umask())


def _apply_default_modes(root: Path) -> None:
    """Give every file and folder under ``root`` at least the permissions a plain ``open``/``mkdir`` would (0666/0777
    less the umask): writers such as safetensors' ``save_model`` create private 0600 files; execute bits are kept."""
    mask = _umask()
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            entry = os.path.join(folder, name)
            if not os.path.islink(entry):
                os.chmod(entry, (os.stat(entry).st_mode | 0o777) & 0o7777 & ~mask)
        for name in files:
            entry = os.path.join(folder, name)
            if not os.path.islink(entry):
                os.chmod(entry, (os.stat(entry).st_mode | 0o666) & 0o7777 & ~mask)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    _apply_default_mode(tmp_path, 0o666)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        _apply_default_mode(tmp_path, 0o666)  # writers that recreate the file (safetensors) reset its mode
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


#: The temporary sibling of an atomic directory: ``.NAME.<pid>-<random>.partial`` (the pid tells a killed writer's
#: leftovers from a live one); ``.NAME.<random>.partial`` is the pid-less form older versions wrote.
_PARTIAL = re.compile(r"^\.(?P<name>.+)\.(?:(?P<pid>\d+)-)?[a-z0-9_]{8}\.partial$")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists but belongs to someone else
        return True
    return True


def remove_stale_partials(path: str | Path) -> list[Path]:
    """Remove the ``.NAME.*.partial`` siblings of ``path`` that writers killed mid-way left behind (their process is
    gone, or they predate the pid in the name); a live writer's directory is kept. Returns what was removed."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    removed = []
    for entry in path.parent.iterdir():
        match = _PARTIAL.match(entry.name)
        if match is None or match["name"] != path.name or not entry.is_dir():
            continue
        if match["pid"] is not None and _pid_alive(int(match["pid"])):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


# -- checking an output location before the work -------------------------------------------------------------------
#: Bytes a name must leave free for the temporary siblings an atomic directory uses beside it
#: (``.NAME.<pid>-<8 random>.partial``, ``.NAME.old``, ``.NAME.lock``; a pid has at most 7 digits on Linux).
SIBLING_RESERVE = len(".") + len(".4194304-abcdefgh.partial")

#: What an existing output is to the command writing it: ``refuse`` it (an error), ``replace`` it (a swap in its
#: parent: both must be writable) or write ``into`` it (an existing directory files are added to).
Existing = Literal["refuse", "replace", "into"]


class OutputLocationError(ValueError):
    """An output location that cannot take the output: not writable, too long a name, or a file where a directory
    must go. Raised by :func:`check_output_location` before any work, so nothing is computed only to be lost."""


def _pathconf(directory: Path, name: str, default: int) -> int:
    """``os.pathconf(directory, name)``, or ``default`` where there is no pathconf (Windows) or the filesystem does
    not say."""
    try:
        return int(os.pathconf(directory, name))
    except (OSError, ValueError, AttributeError):
        return default


def _probe_write(directory: Path) -> OSError | None:
    """Create and remove a file in ``directory``: the only test a read-only mount or a root-owned folder cannot
    fool (``os.access`` says yes to root on a read-only filesystem). None when it worked."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".edgecap-probe-", dir=directory)
    except OSError as exc:
        return exc
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None


def _nearest_existing(path: Path) -> Path:
    for parent in (path, *path.parents):
        if os.path.lexists(parent):
            return parent
    return Path(path.anchor or ".")


def check_output_location(
    path: str | Path, *, existing: Existing = "refuse", what: str = "", reserve: int = SIBLING_RESERVE
) -> Path:
    """Check, before any work, that a directory can be written at ``path``; returns ``path``.

    Every command that writes an output directory calls this first (export, bench, data synth, features, train,
    import), so a bad location fails in a second with one clear line instead of a traceback after the work.

    Args:
        path: the output directory (created later, parents included, by the writer).
        existing: what an existing ``path`` is to the writer (:data:`Existing`).
        what: how the error names the location (``"--out"``); empty: by its path alone.
        reserve: bytes the last name must leave free for temporary siblings (0 when written in place).

    Raises:
        FileExistsError: ``path`` exists and ``existing="refuse"``.
        OutputLocationError: a name too long for its filesystem, a file where a directory must be, or a directory
            that cannot be written (read-only filesystem, permissions).
    """
    path = Path(os.path.abspath(path))
    what = f"{what}: " if what else ""
    anchor = _nearest_existing(path)
    filesystem = anchor if anchor.is_dir() else anchor.parent
    limit = _pathconf(filesystem, "PC_NAME_MAX", 255)
    for i, part in enumerate(path.parts[1:], start=1):
        size = len(os.fsencode(part))
        room = limit - (reserve if i == len(path.parts) - 1 else 0)
        if size > room:
            shown = part if len(part) <= 40 else f"{part[:37]}..."
            allows = f"{room} ({limit} less {reserve} for an atomic write's siblings)" if room < limit else room
            raise OutputLocationError(
                f"{what}the name {shown!r} is {size} bytes; this filesystem allows {allows}: choose a shorter name"
            )
    if len(os.fsencode(str(path))) + reserve > _pathconf(filesystem, "PC_PATH_MAX", 4096):
        raise OutputLocationError(f"{what}the path {str(path)[:60]}... is too long for this filesystem")
    if anchor != path and not anchor.is_dir():
        raise OutputLocationError(f"{what}cannot create {path}: {anchor} is a file, not a directory")
    if anchor == path:
        if not path.is_dir():
            raise OutputLocationError(f"{what}{path} exists and is not a directory")
        if existing == "refuse":
            raise FileExistsError(f"{what}{path} already exists; pass --overwrite (overwrite=True) to replace it")
    where = [anchor] if anchor != path else ([path] if existing == "into" else [path.parent, path])
    for directory in where:
        error = _probe_write(directory)
        if error is not None:
            reason = error.strerror or str(error)
            raise OutputLocationError(f"{what}cannot write to {directory} ({reason}): choose another location")
    return path


class OutputBusyError(FileExistsError):
    """Another live process is writing the same output (its lock file is beside the target)."""


def _lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


def _take_lock(lock: Path) -> None:
    """Create ``lock`` holding this pid, atomically (``os.link`` of a complete file: it fails if ``lock`` exists),
    taking over a lock whose process is gone."""
    fd, tmp = tempfile.mkstemp(prefix=f"{lock.name}.", suffix=".tmp", dir=lock.parent)
    try:
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        os.close(fd)
        for _ in range(2):
            try:
                os.link(tmp, lock)
                return
            except FileExistsError:
                try:
                    pid = int(lock.read_text(encoding="ascii").strip())
                except (OSError, ValueError):
                    pid = None
                if pid is not None and (pid == os.getpid() or _pid_alive(pid)):
                    target = lock.with_name(lock.name[1 : -len(".lock")])
                    raise OutputBusyError(
                        f"{lock.parent / target} is being written by another process (pid {pid}); wait for it, or "
                        f"remove {lock} if that process is not edgecap"
                    ) from None
                lock.unlink(missing_ok=True)  # its writer was killed: take it over
        raise OutputBusyError(f"could not take the lock {lock}: another writer keeps taking it")
    finally:
        Path(tmp).unlink(missing_ok=True)


#: Locks this process holds: lock path -> the thread holding it (a thread may take its own lock again).
_HELD: dict[Path, int] = {}


@contextlib.contextmanager
def output_lock(path: str | Path) -> Iterator[None]:
    """Hold ``.NAME.lock`` beside ``path`` while writing it: a second writer to the same place (another process, or
    another thread of this one) fails at once (:class:`OutputBusyError`) instead of computing its output and
    replacing the first one's. Re-entrant within a thread (``export`` holds it around ``create_bundle``)."""
    lock = _lock_path(Path(os.path.abspath(path)))
    me = threading.get_ident()
    if _HELD.get(lock) == me:
        yield
        return
    if lock in _HELD:
        raise OutputBusyError(f"{path} is being written by another thread of this process")
    lock.parent.mkdir(parents=True, exist_ok=True)
    _take_lock(lock)
    _HELD[lock] = me
    try:
        yield
    finally:
        _HELD.pop(lock, None)
        lock.unlink(missing_ok=True)


def _recover_interrupted_swap(path: Path, old: Path) -> None:
    # A writer killed between its two renames leaves the previous directory at .NAME.old and nothing at NAME.
    if old.exists():
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(old, path)


@contextlib.contextmanager
def atomic_directory(path: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Build a directory in a temporary sibling and move it into place only when complete.

    The location is checked first (:func:`check_output_location`), and a lock beside it (:func:`output_lock`) keeps
    a second writer to the same place out for the whole build. Leftovers of earlier writers to the same place that
    were killed (stale ``.NAME.*.partial`` folders, a ``.NAME.old`` from a swap cut in half) are cleaned up first.
    Without ``overwrite``, the move refuses a ``path`` that appeared meanwhile (nothing is replaced).
    """
    path = Path(path)
    check_output_location(path, existing="replace" if overwrite else "refuse")
    path.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(path):
        old = path.with_name(f".{path.name}.old")
        _recover_interrupted_swap(path, old)
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path} already exists; pass overwrite=True to replace it")
        remove_stale_partials(path)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.{os.getpid()}-", suffix=".partial", dir=path.parent))
        _apply_default_mode(tmp, 0o777)
        try:
            yield tmp
            _apply_default_modes(tmp)
            _swap_into_place(tmp, path, old, overwrite)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _swap_into_place(tmp: Path, path: Path, old: Path, overwrite: bool) -> None:
    if os.path.lexists(path) and not overwrite:  # appeared while this one was built (a writer without the lock)
        raise FileExistsError(f"{path} appeared while this output was being written; nothing was replaced")
    if os.path.lexists(path):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, path)  # onto a non-empty directory that appeared since the check this fails: nothing lost
