"""Stream outputs (edgecap.runtime.stream.outputs): WebVTT, SRT and JSONL that parse back with maintained parsers,
cues that run until the next caption, a killed writer leaving valid files, and a status line only on a terminal."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from edgecap.runtime.stream.events import StreamEvent
from edgecap.runtime.stream.outputs import JsonlWriter, SrtWriter, StatusLine, WebVttWriter, srt_time, vtt_time

ROOT = Path(__file__).resolve().parents[3]
CAPTIONS = [(0.0, "a red square on a field"), (0.5, "a blue <square> & more"), (1.25, "two\nlines --> one"), (2.0, "")]


def events() -> list[StreamEvent]:
    latency = {"read": 0.001, "preprocess": 0.002, "queue": 0.0, "gate": 0.0, "caption": 0.1, "total": 0.1031234567}
    return [StreamEvent(t, 5 * i, c, dict(latency), skipped=i, dropped=i % 2) for i, (t, c) in enumerate(CAPTIONS)]


def vtt_cues(text: str) -> list[tuple[float, float, str]]:
    import webvtt

    def seconds(stamp: str) -> float:
        h, m, s = stamp.split(":")
        return int(h) * 3600 + int(m) * 60 + float(s)

    return [(seconds(c.start), seconds(c.end), c.text) for c in webvtt.from_string(text)]


def srt_cues(text: str) -> list[tuple[float, float, str]]:
    import srt

    return [(s.start.total_seconds(), s.end.total_seconds(), s.content) for s in srt.parse(text)]


def write_all(tmp_path: Path, end_s: float | None = 3.0) -> dict[str, Path]:
    paths = {"vtt": tmp_path / "out.vtt", "srt": tmp_path / "out.srt", "jsonl": tmp_path / "out.jsonl"}
    writers = [WebVttWriter(paths["vtt"]), SrtWriter(paths["srt"]), JsonlWriter(paths["jsonl"])]
    for event in events():
        for writer in writers:
            writer.write(event)
    for writer in writers:
        writer.close(end_s)
    return paths


def test_subtitles_parse_back_with_cues_until_the_next_caption(tmp_path: Path) -> None:
    paths = write_all(tmp_path)
    vtt, srt = vtt_cues(paths["vtt"].read_text()), srt_cues(paths["srt"].read_text())
    expected = [(0.0, 0.5), (0.5, 1.25), (1.25, 2.0), (2.0, 3.0)]  # the last one ends with the stream
    assert [(a, b) for a, b, _ in vtt] == expected == [(a, b) for a, b, _ in srt]
    # one line per cue, nothing that would end a cue or start a timing early; WebVTT escapes its markup
    assert [t for _, _, t in srt] == ["a red square on a field", "a blue <square> & more", "two lines -> one", ""]
    assert [t for _, _, t in vtt][1:3] == ["a blue &lt;square&gt; &amp; more", "two lines -&gt; one"]
    assert paths["vtt"].read_text().startswith("WEBVTT\n\n1\n00:00:00.000 --> 00:00:00.500\n")


def test_jsonl_lines_carry_time_index_caption_counts_and_latency(tmp_path: Path) -> None:
    text = write_all(tmp_path)["jsonl"].read_text(encoding="utf-8")
    assert text.endswith("\n")
    lines = [json.loads(line) for line in text.splitlines()]
    assert [list(line) for line in lines] == [["pts_s", "index", "caption", "latency_s", "skipped", "dropped"]] * 4
    assert [(d["pts_s"], d["index"], d["caption"]) for d in lines] == [
        (t, 5 * i, c) for i, (t, c) in enumerate(CAPTIONS)
    ]
    assert [(d["skipped"], d["dropped"]) for d in lines] == [(0, 0), (1, 1), (2, 0), (3, 1)]
    assert lines[0]["latency_s"] == {"read": 0.001, "preprocess": 0.002, "queue": 0.0, "gate": 0.0, "caption": 0.1,
                                     "total": 0.103123}  # fmt: skip


def test_the_last_cue_ends_at_the_stream_end_or_one_period_later(tmp_path: Path) -> None:
    def last_end(writer: SrtWriter, end_s: float | None) -> float:
        writer.write(StreamEvent(0.0, 0, "a"))
        writer.write(StreamEvent(0.4, 4, "b"))
        writer.close(end_s)
        return srt_cues(writer.path.read_text())[-1][1]

    assert last_end(SrtWriter(tmp_path / "a.srt"), 7.5) == 7.5
    assert last_end(SrtWriter(tmp_path / "b.srt", period_s=0.5), None) == 0.9  # the sampling period
    assert last_end(SrtWriter(tmp_path / "c.srt"), None) == 0.8  # the gap between the last two captions
    assert last_end(SrtWriter(tmp_path / "d.srt"), 0.4) == 0.8  # an end that is no later than the cue's start
    one = SrtWriter(tmp_path / "e.srt")
    one.write(StreamEvent(2.0, 0, "only"))
    one.close()
    assert srt_cues(one.path.read_text()) == [(2.0, 3.0, "only")]  # no period known: 1 s


def test_cues_at_one_timestamp_still_end_after_they_start(tmp_path: Path) -> None:
    with WebVttWriter(tmp_path / "same.vtt") as writer:
        writer.write(StreamEvent(1.0, 10, "a"))
        writer.write(StreamEvent(1.0, 10, "b"))
    cues = vtt_cues((tmp_path / "same.vtt").read_text())
    assert [(a, b) for a, b, _ in cues] == [(1.0, 1.001), (1.0, 2.0)] and all(b > a for a, b, _ in cues)


def test_an_empty_stream_writes_valid_empty_files(tmp_path: Path) -> None:
    paths = {k: tmp_path / f"none.{k}" for k in ("vtt", "srt", "jsonl")}
    for cls, key in ((WebVttWriter, "vtt"), (SrtWriter, "srt"), (JsonlWriter, "jsonl")):
        cls(paths[key]).close(5.0)
    assert paths["vtt"].read_text() == "WEBVTT\n\n" and vtt_cues(paths["vtt"].read_text()) == []
    assert paths["srt"].read_text() == paths["jsonl"].read_text() == ""


def test_timestamps_format() -> None:
    assert vtt_time(3725.0456) == "01:02:05.046" and srt_time(3725.0456) == "01:02:05,046"
    assert vtt_time(0.0) == "00:00:00.000" and srt_time(59.9996) == "00:01:00,000"


KILLED_WRITER = """
import sys
from edgecap.runtime.stream.events import StreamEvent
from edgecap.runtime.stream.outputs import JsonlWriter, SrtWriter, WebVttWriter
out = sys.argv[1]
writers = [WebVttWriter(out + ".vtt"), SrtWriter(out + ".srt"), JsonlWriter(out + ".jsonl")]
for i in range(1000):
    event = StreamEvent(i * 0.5, i * 15, f"caption number {i}", {"total": 0.1})
    for writer in writers:
        writer.write(event)
    print(i, flush=True)
    sys.stdin.readline()  # the parent kills the process while it waits here
"""


def test_a_killed_run_leaves_valid_files_up_to_its_last_completed_cue(tmp_path: Path) -> None:
    out = tmp_path / "killed"
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        for i in range(6):
            assert child.stdout.readline().strip() == str(i)
            if i < 5:
                child.stdin.write("\n")
                child.stdin.flush()
        child.send_signal(signal.SIGKILL)  # no close(), no flush, no atexit
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        child.kill()
    # six captions written: the first five cues are complete (the sixth's end was never known); every JSONL line is
    expected = [(i * 0.5, (i + 1) * 0.5, f"caption number {i}") for i in range(5)]
    assert vtt_cues(out.with_suffix(".vtt").read_text()) == expected
    assert srt_cues(out.with_suffix(".srt").read_text()) == expected
    lines = out.with_suffix(".jsonl").read_text().splitlines()
    assert [json.loads(line)["caption"] for line in lines] == [f"caption number {i}" for i in range(6)]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_status_line_rewrites_itself_on_a_terminal_only() -> None:
    terminal = _Terminal()
    status = StatusLine(terminal)
    assert status.enabled
    status.update("t=1.00s frame 10")
    status.update("t=2.00s")
    status.clear()
    assert terminal.getvalue() == "\rt=1.00s frame 10" + "\rt=2.00s" + " " * 9 + "\r" + " " * 7 + "\r"
    pipe = io.StringIO()
    quiet = StatusLine(pipe)
    quiet.update("t=1.00s")
    quiet.clear()
    assert not quiet.enabled and pipe.getvalue() == ""


def test_the_status_line_fits_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "20")
    terminal = _Terminal()
    StatusLine(terminal).update("x" * 50 + "\nmore")
    assert terminal.getvalue() == "\r" + "x" * 19
