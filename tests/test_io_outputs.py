"""Output locations (``edgecap.runtime._io``): checked before any work, one writer at a time, and the swap into place
never
replaces an output that appeared while this one was being built."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from edgecap.runtime import _io
from edgecap.runtime._io import (
    OutputBusyError,
    OutputLocationError,
    atomic_directory,
    check_output_location,
    output_lock,
)


def test_a_name_too_long_for_the_filesystem_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OutputLocationError, match="300 bytes.*choose a shorter name"):
        check_output_location(tmp_path / ("b" * 300), what="--out")
    # the atomic write's temporary sibling (.NAME.<pid>-<random>.partial) needs room too
    with pytest.raises(OutputLocationError, match="less"):
        check_output_location(tmp_path / ("b" * 240))
    assert check_output_location(tmp_path / ("b" * 200)) == tmp_path / ("b" * 200)
    assert check_output_location(tmp_path / ("b" * 250), reserve=0) == tmp_path / ("b" * 250)


def test_a_file_in_the_way_and_an_existing_output_are_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputLocationError, match="exists and is not a directory"):
        check_output_location(tmp_path / "f", existing="into")
    with pytest.raises(OutputLocationError, match="is a file, not a directory"):
        check_output_location(tmp_path / "f" / "out", existing="into")
    with pytest.raises(FileExistsError, match="already exists"):
        check_output_location(tmp_path, existing="refuse")
    assert check_output_location(tmp_path, existing="into") == tmp_path


def test_a_location_that_cannot_be_written_is_refused() -> None:
    # /sys takes no new entries, not even from root: the probe, not os.access, must say so
    with pytest.raises(OutputLocationError, match="cannot write to /sys/kernel"):
        check_output_location("/sys/kernel/edgecap-out/deeper")


def test_replacing_needs_the_target_and_its_parent_writable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "bundle"
    target.mkdir()
    probed: list[Path] = []

    def probe(directory: Path) -> OSError | None:
        probed.append(Path(directory))
        return OSError(30, "Read-only file system") if Path(directory) == target else None

    monkeypatch.setattr(_io, "_probe_write", probe)
    with pytest.raises(OutputLocationError, match="Read-only file system"):
        check_output_location(target, existing="replace")
    assert probed == [tmp_path, target]
    with pytest.raises(OutputLocationError), atomic_directory(target, overwrite=True):
        raise AssertionError("built before the check")


def test_the_swap_refuses_an_output_that_appeared_meanwhile(tmp_path: Path) -> None:
    target = tmp_path / "bundle"
    with pytest.raises(FileExistsError, match="appeared"), atomic_directory(target) as tmp:
        (tmp / "second").write_text("mine")
        target.mkdir()  # another writer finished first
        (target / "first").write_text("theirs")
    assert [p.name for p in target.iterdir()] == ["first"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]  # no partial, no lock left


def test_a_second_writer_to_the_same_place_is_refused_at_once(tmp_path: Path) -> None:
    target = tmp_path / "bundle"
    started, finish = threading.Event(), threading.Event()

    def first() -> None:
        with atomic_directory(target) as tmp:
            (tmp / "first").write_text("x")
            started.set()
            finish.wait(10)

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert started.wait(10)
        with pytest.raises(FileExistsError, match="being written"), atomic_directory(target) as tmp:
            (tmp / "second").write_text("y")
    finally:
        finish.set()
        thread.join()
    assert [p.name for p in target.iterdir()] == ["first"]


def test_a_lock_of_a_live_process_refuses_and_a_dead_ones_is_taken_over(tmp_path: Path) -> None:
    target = tmp_path / "bundle"
    lock = tmp_path / ".bundle.lock"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        lock.write_text(f"{other.pid}\n")
        with pytest.raises(OutputBusyError, match=f"pid {other.pid}"), output_lock(target):
            pass
    finally:
        other.kill()
        other.wait()
    with output_lock(target):  # its writer is gone: the lock is stale
        assert lock.read_text().strip() != str(other.pid)
    assert not lock.exists()
