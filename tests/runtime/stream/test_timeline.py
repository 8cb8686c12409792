"""A variable frame rate is not damage (edgecap.runtime.stream.timeline): complete variable-frame-rate files read to
their end without an error in every container, while cut ones, and constant-rate ones that lost B-frames, still do."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgecap.runtime.stream.sources import StreamSourceError, open_source
from edgecap.runtime.stream.timeline import Timeline
from tests.runtime.stream.videos import decoded_times, make_vfr_video, truncate


def _bursts() -> list[float]:
    """Bursts of three frames 20 ms apart, 400 ms between bursts (a motion-triggered camera): 30 frames in 4.4 s."""
    times = [0.0]
    for i in range(29):
        times.append(times[-1] + (0.02 if i % 3 else 0.4))
    return times


#: A 30 fps screen capture that sends a frame only when the screen changes: gaps of 1 to 12 periods, the longest
#: just before the end.
DROPPED = [k / 30 for k in (0, 1, 2, 3, 7, 8, 9, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 45)]

TIMELINES = {"bursts": _bursts(), "dropped": DROPPED, "long-last": [0.0, 0.1, 0.2, 0.3, 2.5]}


@pytest.mark.parametrize("codec", ["mpeg4", "libx264"])  # libx264: B-frames, a reordering decoder
@pytest.mark.parametrize("suffix", [".mkv", ".mp4", ".ts"])
@pytest.mark.parametrize("name", sorted(TIMELINES))
def test_a_complete_variable_frame_rate_file_is_not_damaged(tmp_path: Path, name: str, suffix: str, codec: str) -> None:
    clip = make_vfr_video(tmp_path / f"{name}{suffix}", TIMELINES[name], codec=codec)
    source = open_source(clip)
    try:
        frames = list(source)  # raises StreamSourceError when the file is taken for a cut one
    finally:
        source.close()
    times = decoded_times(clip)
    assert len(frames) == len(TIMELINES[name]) == len(times)
    assert [f.pts_s for f in frames] == pytest.approx([t - times[0] for t in times], abs=1e-6)
    assert [f.pts_s for f in frames] == pytest.approx(TIMELINES[name], abs=2e-3)


@pytest.mark.parametrize("codec", ["mpeg4", "libx264"])
def test_a_cut_variable_frame_rate_file_is_still_truncated(tmp_path: Path, codec: str) -> None:
    clip = make_vfr_video(tmp_path / "bursts.mkv", _bursts(), codec=codec)
    source = open_source(truncate(clip, tmp_path / "cut.mkv", 0.7))
    frames = []
    with pytest.raises(StreamSourceError, match="truncated or damaged: the video ends at"):
        for frame in source:
            frames.append(frame)
    source.close()
    assert 5 <= len(frames) < 30


def _timeline(times: list[float], fps: float = 10) -> Timeline:
    timeline = Timeline(fps)
    for t in times:
        timeline.add(t)
    return timeline


def test_frames_lost_before_the_last_one_are_a_cut_only_in_a_regular_reordered_stream() -> None:
    lost = [i / 10 for i in range(25)] + [2.8]  # 2.5, 2.6, 2.7 lost; the file announces 3.0 s
    said = _timeline(lost).cut_short(3.0, reordered=True)
    assert said.startswith("truncated or damaged: 3 frames missing before the last one (at 2.800 s)")
    assert _timeline(lost).cut_short(3.0, reordered=False) == ""  # no reordering: a cut loses only the end
    assert _timeline(lost).cut_short(2.9, reordered=True) == ""  # the last frame ends the video: a gap, not a cut
    irregular = [0.0, 0.02, 0.4, 0.42] + [0.5 + i / 10 for i in range(20)] + [2.8]
    assert _timeline(irregular).cut_short(3.0, reordered=True) == ""  # gaps everywhere: a variable frame rate


def test_the_longest_gap_is_how_long_the_last_frame_may_last() -> None:
    assert _timeline([0.0, 0.1, 2.0]).cut_short(4.0, reordered=False) == ""  # 1.9 s gaps: the last may last 1.9 s
    said = _timeline([0.0, 0.1, 0.2]).cut_short(4.0, reordered=False)
    assert said == "truncated or damaged: the video ends at 0.300 s of the 4.000 s it announces"
    assert _timeline([]).cut_short(4.0, reordered=False).startswith("truncated or damaged: the video ends at 0.000 s")
    assert Timeline(None).cut_short(4.0, reordered=False) == ""  # no rate, no judgement
