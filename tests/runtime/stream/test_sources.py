"""Frame sources (edgecap.runtime.stream.sources): timestamps that follow the stream, image sequences, and clear
errors naming the source: damaged files after their good frames, missing cameras, silent URLs, GStreamer without
OpenCV, PyAV missing."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgecap.runtime.stream import sources_av
from edgecap.runtime.stream.frames import Frame
from edgecap.runtime.stream.sources import FrameSource, ImageSequence, StreamSourceError, open_source
from tests.runtime.stream.videos import COLOURS, corrupt, decoded_times, make_video, scene_frame, truncate

TWO_SCENES = [(1.5, COLOURS[0]), (1.5, COLOURS[1])]


def read_all(source: FrameSource) -> list[Frame]:
    try:
        return list(source)
    finally:
        source.close()


def read_until_error(spec: Path) -> tuple[list[Frame], StreamSourceError]:
    frames: list[Frame] = []
    source = open_source(spec)
    with pytest.raises(StreamSourceError) as info:
        for frame in source:
            frames.append(frame)
    source.close()
    return frames, info.value


@pytest.mark.parametrize(("suffix", "fps"), [(".mkv", 10), (".mp4", Fraction(30000, 1001)), (".ts", 25)])
def test_frames_carry_the_streams_own_timestamps(tmp_path: Path, suffix: str, fps: Fraction | int) -> None:
    clip = make_video(tmp_path / f"clip{suffix}", TWO_SCENES, fps=fps, size=(64, 48))
    source = open_source(clip)
    assert isinstance(source, FrameSource) and not source.live and source.fps == pytest.approx(float(fps), rel=1e-3)
    frames = read_all(source)
    times = decoded_times(clip)
    assert [f.index for f in frames] == list(range(len(times))) and len(frames) == round(3 * fps)
    # a file's clock starts at its start: an MPEG-TS file's offset (1.4 s by FFmpeg's default) is not a delay
    assert [f.pts_s for f in frames] == pytest.approx([t - times[0] for t in times], abs=1e-6)
    assert [f.pts_s for f in frames] == pytest.approx([i / float(fps) for i in range(len(frames))], abs=2e-3)
    first, last = frames[0].image, frames[-1].image
    assert first.shape == (48, 64, 3) and first.dtype == np.uint8
    assert np.abs(first.reshape(-1, 3).mean(0) - COLOURS[0]).max() < 12  # RGB, not BGR
    assert np.abs(last.reshape(-1, 3).mean(0) - COLOURS[1]).max() < 12


def test_a_truncated_file_yields_its_good_frames_then_names_the_cut(tmp_path: Path) -> None:
    clip = make_video(tmp_path / "clip.mkv", TWO_SCENES, fps=10)
    frames, error = read_until_error(truncate(clip, tmp_path / "cut.mkv", 0.5))
    assert 5 <= len(frames) < 30 and [f.index for f in frames] == list(range(len(frames)))
    last = frames[-1]
    assert str(error).startswith(f"{tmp_path / 'cut.mkv'}: stopped after frame {last.index} at {last.pts_s:.3f} s: ")
    assert "truncated" in str(error)


def test_a_cut_mp4_with_its_index_first_is_caught_by_its_frame_count(tmp_path: Path) -> None:
    clip = make_video(tmp_path / "clip.mp4", TWO_SCENES, fps=10, options={"movflags": "faststart"})
    frames, error = read_until_error(truncate(clip, tmp_path / "cut.mp4", 0.6))
    assert 5 <= len(frames) < 30
    assert f"stopped after frame {frames[-1].index}" in str(error) and "of its 30 frames" in str(error)


def complete_packets(clip: Path, size: int) -> int:
    """How many of ``clip``'s video packets lie wholly within its first ``size`` bytes."""
    import av

    with av.open(str(clip)) as container:
        return sum(1 for p in container.demux(container.streams.video[0]) if p.size and p.pos + p.size <= size)


@pytest.mark.parametrize("codec", ["mpeg4", "libx264"])  # libx264: B-frames, which the decoder holds back
@pytest.mark.parametrize(("suffix", "options"), [(".mkv", None), (".mp4", {"movflags": "faststart"})])
@pytest.mark.parametrize("fraction", [0.5, 0.7, 0.9])
def test_a_cut_file_keeps_every_frame_before_the_cut(
    tmp_path: Path, codec: str, suffix: str, options: dict[str, str] | None, fraction: float
) -> None:
    clip = make_video(tmp_path / f"clip{suffix}", TWO_SCENES, fps=10, codec=codec, options=options)
    cut = truncate(clip, tmp_path / f"cut{suffix}", fraction)
    frames, error = read_until_error(cut)
    present = complete_packets(clip, cut.stat().st_size)
    assert len(frames) >= 0.3 * 30 and len(frames) >= present - 1  # the packet the cut splits may still decode
    assert [f.index for f in frames] == list(range(len(frames)))
    assert all(a.pts_s < b.pts_s for a, b in zip(frames, frames[1:], strict=False))
    last = frames[-1]
    assert str(error).startswith(f"{cut}: stopped after frame {last.index} at {last.pts_s:.3f} s: ")


def test_a_file_cut_inside_its_first_frame_has_no_frame_to_give(tmp_path: Path) -> None:
    clip = make_video(tmp_path / "clip.mkv", TWO_SCENES, fps=10)
    import av

    with av.open(str(clip)) as container:
        first = next(p for p in container.demux(container.streams.video[0]) if p.size)
        middle = first.pos + first.size // 2
    cut = truncate(clip, tmp_path / "cut.mkv", middle / clip.stat().st_size)
    frames, error = read_until_error(cut)
    assert frames == [] and str(error).startswith(f"{cut}: no frame could be read: truncated")


def test_a_cut_mp4_without_its_index_is_not_a_video(tmp_path: Path) -> None:
    clip = make_video(tmp_path / "clip.mp4", TWO_SCENES, fps=10)  # the index (moov) is written last
    with pytest.raises(StreamSourceError, match=r"cut\.mp4: not a video FFmpeg reads"):
        open_source(truncate(clip, tmp_path / "cut.mp4", 0.5))


@pytest.mark.parametrize("suffix", [".mp4", ".mkv"])
def test_a_corrupt_file_yields_its_good_frames_then_names_the_frame(tmp_path: Path, suffix: str) -> None:
    clip = make_video(tmp_path / f"clip{suffix}", TWO_SCENES, fps=10)
    bad = corrupt(clip, tmp_path / f"bad{suffix}", frame=10)  # a key frame: FFmpeg cannot conceal it
    frames, error = read_until_error(bad)
    assert [f.index for f in frames] == list(range(10))
    assert str(error).startswith(f"{bad}: stopped after frame 9 at 0.900 s: Invalid data")


def test_a_file_that_is_not_a_video_is_refused_by_name(tmp_path: Path) -> None:
    notes = tmp_path / "notes.mp4"
    notes.write_text("not a video\n" * 50)
    with pytest.raises(StreamSourceError, match=r"notes\.mp4: not a video FFmpeg reads"):
        open_source(notes)
    with pytest.raises(StreamSourceError, match=r"missing\.mp4: no such file"):
        open_source(tmp_path / "missing.mp4")


@pytest.mark.parametrize("spec", ["/dev/video99", 99])
def test_a_missing_camera_is_a_clear_error_at_once(spec: str | int) -> None:
    started = time.monotonic()
    with pytest.raises(StreamSourceError, match=r"^/dev/video99: no such camera"):
        open_source(spec)
    assert time.monotonic() - started < 1.0


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("scheme", ["rtsp", "http"])
def test_a_url_nobody_listens_on_is_a_clear_error(scheme: str) -> None:
    url = f"{scheme}://127.0.0.1:{_closed_port()}/x"
    started = time.monotonic()
    with pytest.raises(StreamSourceError, match=rf"^{url}: does not answer"):
        open_source(url, timeout_s=2.0)
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("scheme", ["rtsp", "http"])
def test_a_url_that_never_answers_times_out(scheme: str) -> None:
    """A server that accepts the connection and says nothing: the open gives up after timeout_s."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        url = f"{scheme}://127.0.0.1:{silent.getsockname()[1]}/x"
        started = time.monotonic()
        with pytest.raises(StreamSourceError, match=rf"^{url}: no answer within 0\.5 s"):
            open_source(url, timeout_s=0.5)
        assert time.monotonic() - started < 3.0


def test_a_gstreamer_pipeline_without_opencv_says_what_is_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_cv2(name: str, *args: object, **kwargs: object) -> object:
        if name == "cv2":
            raise ImportError("No module named 'cv2'")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_cv2)
    pipeline = "nvarguscamerasrc ! nvvidconv ! video/x-raw,format=BGRx ! videoconvert"
    with pytest.raises(StreamSourceError) as info:
        open_source(pipeline)
    message = str(info.value)
    assert message.startswith(pipeline + ": OpenCV (cv2) is not installed")
    assert "GStreamer" in message and "JetPack" in message


def test_without_pyav_a_video_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clip = make_video(tmp_path / "clip.mkv", TWO_SCENES[:1], fps=5)
    monkeypatch.setattr(sources_av, "_av", lambda: None)
    with pytest.raises(StreamSourceError, match=r"clip\.mkv: reading video needs PyAV .*edgecap\[stream\]"):
        open_source(clip)


def _write_images(folder: Path, n: int) -> list[Path]:
    folder.mkdir()
    paths = []
    for i in range(n):
        paths.append(folder / f"frame{i:03d}.png")
        Image.fromarray(scene_frame(COLOURS[i % len(COLOURS)], (32, 24))).save(paths[-1])
    (folder / "notes.txt").write_text("not a frame")
    return paths


def test_an_image_folder_or_glob_is_a_sequence(tmp_path: Path) -> None:
    paths = _write_images(tmp_path / "frames", 4)
    for spec in (tmp_path / "frames", str(tmp_path / "frames" / "frame*.png")):
        frames = read_all(open_source(spec, sequence_fps=2.0))
        assert [f.pts_s for f in frames] == [0.0, 0.5, 1.0, 1.5] and [f.index for f in frames] == [0, 1, 2, 3]
        assert all(np.array_equal(f.image, np.asarray(Image.open(p))) for f, p in zip(frames, paths, strict=True))
    source = open_source(tmp_path / "frames")
    assert isinstance(source, ImageSequence) and source.fps == 1.0 and not source.live
    assert [f.pts_s for f in read_all(source)] == [0.0, 1.0, 2.0, 3.0]  # 1 frame per second by default


def test_a_bad_image_in_a_sequence_stops_it_after_the_good_ones(tmp_path: Path) -> None:
    paths = _write_images(tmp_path / "frames", 4)
    paths[2].write_bytes(b"\x89PNG broken")
    frames, error = read_until_error(tmp_path / "frames")
    assert len(frames) == 2
    assert str(error).startswith(f"{tmp_path / 'frames'}: stopped after frame 1 at 1.000 s: {paths[2]}")


def test_empty_and_unmatched_sequences_are_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(StreamSourceError, match="empty: no images"):
        open_source(tmp_path / "empty")
    with pytest.raises(StreamSourceError, match=r"\*\.jpg: no file matches"):
        open_source(str(tmp_path / "empty" / "*.jpg"))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "an empty stream source"),
        ("ftp://example/x.mp4", "unsupported URL scheme 'ftp'"),
        (-1, "camera index -1"),
        (3.5, "not float"),
    ],
)
def test_bad_specs_are_refused(spec: object, message: str) -> None:
    with pytest.raises(StreamSourceError, match=message):
        open_source(spec)  # type: ignore[arg-type]


def test_a_url_with_an_exclamation_mark_is_a_url_not_a_pipeline() -> None:
    url = f"rtsp://user:pa!ss@127.0.0.1:{_closed_port()}/x"
    with pytest.raises(StreamSourceError, match="does not answer"):
        open_source(url, timeout_s=2.0)


def test_live_defaults_follow_the_kind_and_can_be_overridden(tmp_path: Path) -> None:
    clip = make_video(tmp_path / "clip.mkv", TWO_SCENES[:1], fps=5)
    assert open_source(clip).live is False
    source = open_source(clip, live=True)  # e.g. a file replayed as a camera would be
    assert source.live is True
    frames = read_all(source)
    assert frames[0].pts_s == 0.0 and frames[-1].pts_s == pytest.approx(1.4, abs=1e-3)


def test_closing_mid_stream_ends_the_iteration(scenes_clip: Path) -> None:
    source = open_source(scenes_clip)
    frames: Iterator[Frame] = iter(source)
    assert next(frames).index == 0
    source.close()
    assert list(frames) == []
    source.close()  # twice is fine


def test_a_live_stream_that_stalls_ends_with_an_error_after_its_frames(tmp_path: Path) -> None:
    """An HTTP stream that sends part of a video and then nothing: its frames, then an error after timeout_s."""
    import threading

    data = make_video(tmp_path / "live.mkv", [(3.0, COLOURS[0])], fps=10).read_bytes()
    done = threading.Event()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)

        def serve() -> None:
            connection, _ = server.accept()
            with connection:
                connection.recv(4096)
                connection.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: video/x-matroska\r\n\r\n" + data[: len(data) // 2]
                )
                done.wait(10)  # then silence, the connection open

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{server.getsockname()[1]}/live.mkv"
        source = open_source(url, timeout_s=0.5)
        assert source.live
        frames: list[Frame] = []
        try:
            with pytest.raises(StreamSourceError) as info:
                frames.extend(source)
        finally:
            done.set()
            source.close()
            thread.join(5)
    assert len(frames) >= 3 and frames[0].pts_s == 0.0
    last = frames[-1]
    assert str(info.value) == f"{url}: stopped after frame {last.index} at {last.pts_s:.3f} s: no frame within 0.5 s"


class _FakeCv2:
    """Just enough of OpenCV for the GStreamer source: a build with or without GStreamer, and a capture of three BGR
    frames 40 ms apart (``pipelines`` records what was opened)."""

    CAP_GSTREAMER, CAP_PROP_FPS, CAP_PROP_POS_MSEC, COLOR_BGR2RGB = 1800, 5, 0, 4
    __version__ = "4.8.0"

    def __init__(self, gstreamer: bool, opens: bool = True) -> None:
        self.gstreamer, self.opens, self.pipelines = gstreamer, opens, []

    def getBuildInformation(self) -> str:  # noqa: N802 (OpenCV's name)
        return f"  Video I/O:\n    GStreamer:                   {'YES (1.20.3)' if self.gstreamer else 'NO'}\n"

    def cvtColor(self, image: np.ndarray, code: int) -> np.ndarray:  # noqa: N802
        assert code == self.COLOR_BGR2RGB
        return image[..., ::-1].copy()

    def VideoCapture(self, pipeline: str, api: int) -> _FakeCapture:  # noqa: N802
        assert api == self.CAP_GSTREAMER
        self.pipelines.append(pipeline)
        return _FakeCapture(self.opens)


class _FakeCapture:
    def __init__(self, opens: bool) -> None:
        self.opens, self.read_count, self.released = opens, 0, False

    def isOpened(self) -> bool:  # noqa: N802
        return self.opens

    def read(self) -> tuple[bool, np.ndarray | None]:
        if self.read_count >= 3:
            return False, None
        self.read_count += 1
        frame = np.zeros((4, 6, 3), np.uint8)
        frame[..., 0] = 200  # blue, in OpenCV's BGR order
        return True, frame

    def get(self, prop: int) -> float:
        return 25.0 if prop == _FakeCv2.CAP_PROP_FPS else 1000.0 + 40.0 * self.read_count

    def release(self) -> None:
        self.released = True


def test_a_gstreamer_pipeline_through_opencv(monkeypatch: pytest.MonkeyPatch) -> None:
    cv2 = _FakeCv2(gstreamer=True)
    monkeypatch.setitem(sys.modules, "cv2", cv2)
    source = open_source("videotestsrc num-buffers=3 ! videoconvert ! video/x-raw,format=BGR")
    assert source.live and source.fps == 25.0
    assert cv2.pipelines == ["videotestsrc num-buffers=3 ! videoconvert ! video/x-raw,format=BGR ! appsink drop=false"]
    frames = read_all(source)
    assert [f.index for f in frames] == [0, 1, 2] and [f.pts_s for f in frames] == pytest.approx([0.0, 0.04, 0.08])
    assert frames[0].image.shape == (4, 6, 3) and frames[0].image[0, 0].tolist() == [0, 0, 200]  # RGB now


def test_gstreamer_errors_say_which_part_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cv2", _FakeCv2(gstreamer=False))
    with pytest.raises(StreamSourceError, match=r"^a ! b: this OpenCV \(4\.8\.0\) is built without GStreamer.*JetPack"):
        open_source("a ! b")
    monkeypatch.setitem(sys.modules, "cv2", _FakeCv2(gstreamer=True, opens=False))
    with pytest.raises(StreamSourceError, match=r"^a ! b: GStreamer could not start the pipeline"):
        open_source("a ! b")
