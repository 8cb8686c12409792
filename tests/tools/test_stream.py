"""The stream benchmark (tools.stream) end to end on a tiny bundle and short clips, and its pieces: the clip
layout, the synthetic clip written and read back, the change-to-caption lags."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.runtime.bundle.helpers import pixel_bundle
from tools.stream import change_lags, main
from tools.stream_clips import Clip, LiveClip, clip_frames, render_scenes, write_clip


def test_a_clip_shows_each_scene_from_its_change() -> None:
    clip = Clip(6.0, 10.0, 320, 240, (0.0, 2.0, 4.0), noise=0.0)
    assert clip.frames == 60 and [clip.scene_at(t) for t in (0.0, 1.99, 2.0, 3.5, 4.0, 5.9)] == [0, 0, 1, 1, 2, 2]
    scenes = [np.full((240, 240, 3), v, np.uint8) for v in (10, 120, 230)]
    frames = list(clip_frames(clip, scenes))
    assert len(frames) == 60 and frames[0].shape == (240, 320, 3)
    assert [int(frames[i][120, 160, 0]) for i in (0, 19, 20, 40)] == [10, 10, 120, 230]


def test_a_written_clip_reads_back_at_its_rate(tmp_path: Path) -> None:
    import av

    clip = Clip(1.0, 30.0, 640, 480, (0.0,))
    path = write_clip(tmp_path / "c.mp4", clip, render_scenes(1, seed=0))
    with av.open(str(path)) as container:
        frames = list(container.decode(video=0))
    assert len(frames) == 30 and (frames[0].width, frames[0].height) == (640, 480)
    assert float(frames[-1].time or 0) == pytest.approx(29 / 30, abs=1e-3)


def test_a_live_clip_plays_in_wall_time() -> None:
    source = LiveClip(Clip(0.3, 30.0, 64, 48, (0.0,)), [np.zeros((48, 48, 3), np.uint8)])
    frames = list(source)
    assert source.live and len(frames) == 9
    assert frames[-1].pts_s >= 8 / 30 - 0.01  # paced: the ninth frame is not due before 8/30 s


def test_change_lags_say_when_each_change_was_first_captioned() -> None:
    clip = Clip(8.0, 30.0, 64, 48, (0.0, 2.0, 4.0, 6.0))
    events = [SimpleNamespace(pts_s=t) for t in (0.0, 2.0, 4.5, 5.0)]
    assert change_lags(events, clip) == [0.0, 0.5, None]  # the scene from 6 s was never captioned


def test_the_benchmark_runs_end_to_end(
    tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    bundle, _ = pixel_bundle(tiny_data, tmp_path_factory)
    out = tmp_path / "stream.json"
    args = ["--model", str(bundle), "--precision", "fp32", "--runs", "1", "--seconds", "4", "--live-seconds", "1"]
    assert main([*args, "--on-change", "0.5", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    (row,) = result["rounds"]
    assert row["throughput"]["samples"] == 8 == row["throughput"]["captioned"]  # 4 s at --every 0.5, none dropped
    assert row["throughput"]["real_time_factor"] > 0
    static = row["static"]
    assert static["captioned"] + static["skipped"] == static["samples"] == 8
    assert len(row["changes"]["lags_s"]) == 1  # one change (at 2 s) in a 4 s clip
    live = row["live"]
    assert live["samples"] == live["captioned"] + live["dropped"] and live["high_water"] <= 8
    assert set(result["calibration"]) == {"within_max", "within_p50", "between_min", "between_p50"}
    assert result["median"]["captioned_per_s"]["median"] > 0 and result["machine"]["cores"] >= 1
