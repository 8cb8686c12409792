"""The journal: whole lines in one write, one writer, a partial last line cut off on resume, refusals before work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgecap.runtime.collections.journal import Journal, JournalError, record_line


def test_records_are_one_compact_json_line_with_the_path_first() -> None:
    assert record_line("a/é.png", "a cat") == '{"path":"a/é.png","caption":"a cat"}\n'.encode()
    assert record_line("b.jpg", error="b.jpg: bad\n  file") == b'{"path":"b.jpg","error":"b.jpg: bad file"}\n'
    odd = os.fsdecode(b"caf\xe9.png")  # not UTF-8: a surrogate escape, kept exact through JSON
    assert os.fsencode(json.loads(record_line(odd, "x"))["path"]) == b"caf\xe9.png"


def test_lines_are_appended_and_a_new_journal_has_nothing_to_resume(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "out.jsonl"
    with Journal.open(out) as journal:
        assert journal.last_path is None and journal.created
        journal.append(record_line("a.png", "one") + record_line("b.png", "two"))
        journal.append(record_line("c.png", error="bad"))
    assert journal.lines_written == 3
    assert [json.loads(line)["path"] for line in out.read_text().splitlines()] == ["a.png", "b.png", "c.png"]
    with pytest.raises(ValueError, match="whole lines"), Journal.open(out, resume=True) as journal:
        journal.append(b'{"path":"d.png"')


def test_an_existing_output_needs_resume_and_resume_cuts_a_partial_last_line(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    whole = record_line("a.png", "one") + record_line("b.png", "two")
    out.write_bytes(whole + b'{"path":"c.png","capt')  # a writer killed mid-line
    with pytest.raises(JournalError, match="--resume"):
        Journal.open(out)
    assert out.read_bytes().endswith(b"capt")  # refused without touching it
    with Journal.open(out, resume=True) as journal:
        assert (journal.last_path, journal.truncated) == ("b.png", len(b'{"path":"c.png","capt'))
        journal.append(record_line("c.png", "three"))
    assert out.read_bytes() == whole + record_line("c.png", "three")


def test_a_long_last_line_and_a_file_without_any_whole_line_are_read_back(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    long_path = "d/" + "x" * 200_000 + ".png"  # longer than one backwards read
    out.write_bytes(record_line("a.png", "one") + record_line(long_path, "two"))
    with Journal.open(out, resume=True) as journal:
        assert journal.last_path == long_path
    out.write_bytes(b'{"path":"a.p')
    with Journal.open(out, resume=True) as journal:
        assert (journal.last_path, out.read_bytes()) == (None, b"")


def test_a_file_that_is_not_a_journal_is_not_resumed(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text("hello\n")
    with pytest.raises(JournalError, match="not an output to resume"):
        Journal.open(out, resume=True)
    assert out.read_text() == "hello\n"


def test_a_second_writer_is_refused_while_the_first_holds_the_file(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    code = f"from edgecap.runtime.collections.journal import Journal; j = Journal.open({str(out)!r}); "
    code += "print('open', flush=True); input()"
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        with pytest.raises(JournalError, match="another process"):
            Journal.open(out, resume=True)
    finally:
        holder.communicate("\n")
    Journal.open(out, resume=True).close()  # the lock went with its process


def test_a_failed_run_leaves_no_empty_file_behind_but_keeps_one_it_resumed(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError), Journal.open(out):
        raise RuntimeError("the workers could not load")
    assert not out.exists()
    out.write_bytes(b"")
    with pytest.raises(RuntimeError), Journal.open(out, resume=True):
        raise RuntimeError("again")
    assert out.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_folder_is_refused_before_any_work(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(JournalError, match="cannot write to"):
            Journal.open(folder / "out.jsonl")
    finally:
        folder.chmod(0o700)


def test_a_directory_or_a_file_in_the_way_is_refused(tmp_path: Path) -> None:
    with pytest.raises(JournalError, match="is a directory"):
        Journal.open(tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(JournalError, match="exists and is not a directory"):
        Journal.open(tmp_path / "file" / "out.jsonl")


def test_a_damaged_last_line_is_not_a_refusal_when_the_file_begins_with_a_record(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(record_line("a.png", "x") + b"garbage\n")
    with Journal.open(out, resume=True) as journal:
        assert journal.last_path is None  # the resumed run reads the whole file (resume.resume_point)
        assert [(n, r) for n, _, r in journal.records()] == [(1, {"path": "a.png", "caption": "x"}), (2, None)]


def test_replace_swaps_the_whole_file_in_one_rename_and_keeps_it_locked(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(record_line("a.png", "x") + b"garbage\n")
    os.chmod(out, 0o640)
    (tmp_path / ".out.jsonl.dead.tmp").write_bytes(b"left by a killed rewrite")
    with Journal.open(out, resume=True) as journal:
        journal.replace(iter([record_line("a.png", "x"), record_line("b.png", "y")]))
        journal.append(record_line("c.png", "z"))
        with pytest.raises(JournalError, match="being written by another process"):
            Journal.open(out, resume=True)
    assert [json.loads(line)["path"] for line in out.read_text().splitlines()] == ["a.png", "b.png", "c.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"] and out.stat().st_mode & 0o777 == 0o640
