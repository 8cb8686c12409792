"""``edgecap stream``: captions of a video into VTT/SRT/JSONL that parse back, outputs checked before the work, a
source error after good frames (exit 1, the good part written), and Ctrl-C or a kill mid-stream leaving valid files."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgecap.cli import main
from tests.runtime.bundle.helpers import pixel_bundle
from tests.runtime.stream.videos import COLOURS, make_vfr_video, make_video, truncate

SCENES = [(2.0, COLOURS[0]), (1.0, COLOURS[1])]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bundle(tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pixel_bundle(tiny_data, tmp_path_factory)[0]


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_video(tmp_path_factory.mktemp("clips") / "clip.mkv", SCENES, fps=10)  # 3 s, a change at 2 s


def _seconds(stamp: str) -> float:
    h, m, s = stamp.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def parse_cues(text: str, vtt: bool) -> list[tuple[float, float, str]]:
    """(start, end, text) of every cue of a WebVTT or SRT file, read back by maintained parsers (webvtt-py, srt)."""
    import srt
    import webvtt

    if vtt:
        cues = [(_seconds(c.start), _seconds(c.end), c.text) for c in webvtt.from_string(text)]
    else:
        cues = [(s.start.total_seconds(), s.end.total_seconds(), s.content) for s in srt.parse(text)]
    assert all(end >= start for start, end, _ in cues), cues
    return cues


def parse_jsonl(text: str) -> list[dict[str, object]]:
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_a_clip_becomes_captions_in_every_format(bundle: Path, clip: Path, tmp_path: Path) -> None:
    out = {k: tmp_path / "sub" / f"clip.{k}" for k in ("vtt", "srt", "jsonl")}
    args = ["stream", str(clip), "--model", str(bundle), "--every", "0.5", "--max-batch", "2"]
    args += [a for k, p in out.items() for a in (f"--{k}", str(p))]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    lines = parse_jsonl(out["jsonl"].read_text())
    assert [line["pts_s"] for line in lines] == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0, 2.5])
    assert [line["index"] for line in lines] == [0, 5, 10, 15, 20, 25]
    assert all(line["caption"] and set(line["latency_s"]) >= {"read", "queue", "caption", "total"} for line in lines)
    for kind in ("vtt", "srt"):
        cues = parse_cues(out[kind].read_text(), vtt=kind == "vtt")
        assert [c[2] for c in cues] == [line["caption"] for line in lines]
        assert [c[0] for c in cues] == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0, 2.5], abs=1e-3)
        assert [c[1] for c in cues[:-1]] == pytest.approx([c[0] for c in cues[1:]], abs=1e-3)  # until the next
        assert cues[-1][1] == pytest.approx(3.0, abs=1e-3)  # the last cue ends with the stream
    stdout = [line for line in result.stdout.splitlines() if line.strip()]
    assert [float(line.split()[0]) for line in stdout] == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0, 2.5])
    assert "6 captioned" in result.stderr and "real time" in result.stderr


def test_existing_and_unwritable_outputs_are_refused_before_any_work(bundle: Path, clip: Path, tmp_path: Path) -> None:
    existing = tmp_path / "old.vtt"
    existing.write_text("keep me")
    base = ["stream", str(clip), "--model", str(bundle)]
    result = CliRunner().invoke(main, [*base, "--vtt", str(existing)])
    assert result.exit_code != 0 and "already exists" in result.output and "--overwrite" in result.output
    assert existing.read_text() == "keep me"
    result = CliRunner().invoke(main, [*base, "--vtt", str(existing), "--overwrite", "--every", "1"])
    assert result.exit_code == 0, result.output
    assert existing.read_text().startswith("WEBVTT")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = CliRunner().invoke(main, [*base, "--jsonl", str(blocker / "out.jsonl")])
    assert result.exit_code != 0 and "a-file" in result.output and "Traceback" not in result.output
    same = tmp_path / "same.txt"
    result = CliRunner().invoke(main, [*base, "--vtt", str(same), "--srt", str(same)])
    assert result.exit_code != 0 and "same file" in result.output and not same.exists()


@pytest.mark.parametrize("flag", ["--jsonl", "--srt", "--vtt"])
def test_no_output_may_be_the_source_even_with_overwrite(bundle: Path, clip: Path, tmp_path: Path, flag: str) -> None:
    video = tmp_path / "good.mkv"
    video.write_bytes(clip.read_bytes())
    (tmp_path / "link.mkv").symlink_to(video)
    os.link(video, tmp_path / "hard.mkv")
    for name in ("good.mkv", "link.mkv", "hard.mkv", "./good.mkv"):
        for given in (str(video), f"file://{video}"):
            args = ["stream", given, "--model", str(bundle), flag, str(tmp_path / name), "--overwrite"]
            result = CliRunner().invoke(main, args)
            assert result.exit_code != 0 and "is the source" in result.output and "Traceback" not in result.output
            assert video.read_bytes() == clip.read_bytes()


def test_no_output_may_be_an_image_of_a_source_folder_or_glob(bundle: Path, tmp_path: Path) -> None:
    frames = tmp_path / "frames"
    frames.mkdir()
    from PIL import Image

    for i in range(2):
        Image.new("RGB", (32, 24), (40 * i, 90, 200)).save(frames / f"{i}.png")
    kept = (frames / "0.png").read_bytes()
    base = ["--model", str(bundle), "--overwrite"]
    for source, out in [
        (str(frames), frames / "0.png"),  # an image the folder reads
        (str(frames), frames / "new.PNG"),  # one the next run would read
        (str(frames / "*.png"), frames / "0.png"),
        (str(frames / "*"), frames / "captions.jsonl"),  # the glob matches it
    ]:
        result = CliRunner().invoke(main, ["stream", source, *base, "--jsonl", str(out)])
        assert result.exit_code != 0 and "is the source" in result.output, (source, out, result.output)
        assert (frames / "0.png").read_bytes() == kept and not (frames / "new.PNG").exists()
    result = CliRunner().invoke(main, ["stream", str(frames), *base, "--jsonl", str(frames / "captions.jsonl")])
    assert result.exit_code == 0, result.output  # not an image: the folder never reads it
    assert len(parse_jsonl((frames / "captions.jsonl").read_text())) == 2


def test_outputs_that_are_one_file_or_nest_are_refused(bundle: Path, clip: Path, tmp_path: Path) -> None:
    base = ["stream", str(clip), "--model", str(bundle), "--overwrite"]
    first = tmp_path / "a.srt"
    first.write_text("keep")
    os.link(first, tmp_path / "b.vtt")
    result = CliRunner().invoke(main, [*base, "--srt", str(first), "--vtt", str(tmp_path / "b.vtt")])
    assert result.exit_code != 0 and "same file" in result.output and first.read_text() == "keep"
    nested = ["--jsonl", str(tmp_path / "out"), "--srt", str(tmp_path / "out" / "x.srt")]
    result = CliRunner().invoke(main, [*base, *nested])
    assert result.exit_code != 0 and "one inside the other" in result.output and not (tmp_path / "out").exists()


def test_a_complete_variable_frame_rate_matroska_file_is_captioned_whole(bundle: Path, tmp_path: Path) -> None:
    times = [0.0]
    for i in range(29):  # bursts of 3 frames 20 ms apart, 400 ms between bursts: 30 frames in 4.4 s
        times.append(times[-1] + (0.02 if i % 3 else 0.4))
    video = make_vfr_video(tmp_path / "vfr.mkv", times)
    result = CliRunner().invoke(main, ["stream", str(video), "--model", str(bundle), "--jsonl", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert "truncated" not in result.output and "30 frame(s) read" in result.stderr
    lines = parse_jsonl((tmp_path / "o").read_text())
    assert [line["pts_s"] for line in lines] == pytest.approx(times, abs=2e-3)


def test_every_and_fps_together_are_refused(bundle: Path, clip: Path) -> None:
    result = CliRunner().invoke(main, ["stream", str(clip), "--model", str(bundle), "--every", "1", "--fps", "2"])
    assert result.exit_code != 0 and "--every" in result.output and "--fps" in result.output


def test_a_missing_bundle_is_a_clear_error(clip: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["stream", str(clip), "--model", str(tmp_path / "nothing")])
    assert result.exit_code != 0 and "no bundle found" in result.output


def _start(bundle: Path, video: Path, out: Path) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "edgecap", "stream", str(video), "--model", str(bundle), "--threads", "1"]
    args += ["--max-batch", "1", "--vtt", str(out / "out.vtt"), "--srt", str(out / "out.srt")]
    args += ["--jsonl", str(out / "out.jsonl")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    # a pytest-xdist worker may run with SIGINT ignored, which a child inherits (and then Python installs no Ctrl-C
    # handler): give the command the disposition a terminal gives it
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, preexec_fn=_default_sigint
    )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_ctrl_c_or_a_kill_mid_stream_leaves_valid_files(
    bundle: Path, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, sig: signal.Signals
) -> None:
    """Every frame sampled from a long clip, stopped after a few captions: Ctrl-C closes the files and prints the
    summary (exit 130); a kill leaves what was flushed, which still parses, up to its last caption."""
    video = tmp_path_factory.getbasetemp() / "long.mkv"
    if not video.exists():
        # 9000 frames: far more than the test waits for, even when a loaded machine lets it read its pipe late
        make_video(video, [(300.0, COLOURS[2])], fps=30)
    process = _start(bundle, video, tmp_path)
    assert process.stdout is not None
    captions = 0
    deadline = time.monotonic() + 120
    while captions < 3 and time.monotonic() < deadline:
        if process.stdout.readline():
            captions += 1
    assert captions == 3, process.stderr.read() if process.stderr else ""
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=60)
    if sig == signal.SIGINT:
        assert process.returncode == 130, stderr
        assert "captioned" in stderr and "interrupted" in stderr
    else:
        assert process.returncode == -signal.SIGKILL
    lines = parse_jsonl((tmp_path / "out.jsonl").read_text())
    assert len(lines) >= 3 and [line["index"] for line in lines] == list(range(len(lines)))
    for kind in ("vtt", "srt"):
        cues = parse_cues((tmp_path / f"out.{kind}").read_text(), vtt=kind == "vtt")
        # a cue is written when the next caption comes (or at close): a kill loses at most the last one
        expected = len(lines) if sig == signal.SIGINT else len(lines) - 1
        assert len(cues) >= expected - 1 and [c[2] for c in cues] == [line["caption"] for line in lines][: len(cues)]


def test_a_truncated_file_writes_its_good_frames_then_fails(bundle: Path, tmp_path: Path) -> None:
    whole = make_video(tmp_path / "whole.mkv", [(3.0, COLOURS[3]), (3.0, COLOURS[4])], fps=10)
    cut = truncate(whole, tmp_path / "cut.mkv", 0.7)
    out = {k: tmp_path / f"cut.{k}" for k in ("vtt", "srt", "jsonl")}
    args = ["stream", str(cut), "--model", str(bundle), *(a for k, p in out.items() for a in (f"--{k}", str(p)))]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    match = re.search(r"stopped after frame (\d+) at ([\d.]+) s", result.stderr)
    assert match, result.stderr
    last = int(match.group(1))
    assert 0 < last < 59 and "Traceback" not in result.output and "captioned" in result.stderr
    lines = parse_jsonl(out["jsonl"].read_text())
    assert [line["index"] for line in lines] == list(range(last + 1))  # every frame sampled, up to the last good one
    for kind in ("vtt", "srt"):
        cues = parse_cues(out[kind].read_text(), vtt=kind == "vtt")
        assert [c[2] for c in cues] == [line["caption"] for line in lines]
        assert cues[-1][1] == pytest.approx((last + 1) / 10, abs=1e-3)  # the last cue ends where the good part does


def test_a_missing_camera_is_named_before_the_model_loads(bundle: Path) -> None:
    result = CliRunner().invoke(main, ["stream", "/dev/video97", "--model", str(bundle), "--timeout", "2"])
    assert result.exit_code != 0 and "/dev/video97" in result.output and "Traceback" not in result.output
    assert "runtime:" not in result.output  # the source failed first: no model was loaded
