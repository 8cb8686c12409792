"""Atomic file writes: a reader never sees a half-written file, a crash never leaves one."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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

    Leftovers of earlier writers to the same place that were killed (stale ``.NAME.*.partial`` folders, a
    ``.NAME.old`` from a swap cut in half) are cleaned up first.
    """
    path = Path(path)
    old = path.with_name(f".{path.name}.old")
    _recover_interrupted_swap(path, old)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.{os.getpid()}-", suffix=".partial", dir=path.parent))
    _apply_default_mode(tmp, 0o777)
    try:
        yield tmp
        _apply_default_modes(tmp)
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
