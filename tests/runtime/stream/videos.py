"""Short synthetic videos for the stream tests (shared with the pipeline and CLI tests): scenes of known colours that
change at known times, encoded with PyAV, and damaged copies of them.

``make_video(path, [(2.0, (200, 30, 30)), (1.0, (20, 20, 220))], fps=10, size=(64, 48))`` is a 3 s clip whose scene
changes at 2.0 s. Each frame is its scene's colour under a fixed diagonal pattern plus a little per-frame noise (a
camera's), so the encoder has real work and a static scene is not bit-identical from frame to frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np

Scene = tuple[float, tuple[int, int, int]]

#: Distinct colours for scenes (red, blue, green, yellow, magenta, grey).
COLOURS: tuple[tuple[int, int, int], ...] = (
    (210, 40, 40),
    (30, 50, 220),
    (40, 190, 60),
    (230, 210, 40),
    (200, 50, 200),
    (128, 128, 128),
)

#: The scenes of the session clip ``scenes_clip`` (conftest.py): 2 s red, 2 s blue, 1 s green, 3 s red again
#: (changes at 2, 4 and 5 s).
SCENES: list[Scene] = [(2.0, COLOURS[0]), (2.0, COLOURS[1]), (1.0, COLOURS[2]), (3.0, COLOURS[0])]


def scene_frame(rgb: tuple[int, int, int], size: tuple[int, int], *, noise: float = 0.0, seed: int = 0) -> np.ndarray:
    """One H×W×3 uint8 frame: ``rgb`` with a diagonal stripe pattern, plus uniform noise of ±``noise``."""
    width, height = size
    y, x = np.mgrid[0:height, 0:width]
    stripes = ((x + y) // 8 % 2).astype(np.float32)[..., None] * 24.0 - 12.0
    image = np.asarray(rgb, np.float32)[None, None, :] + stripes
    if noise:
        image = image + np.random.default_rng(seed).uniform(-noise, noise, size=image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def scene_starts(scenes: Sequence[Scene]) -> list[float]:
    """The time (seconds) at which each scene begins."""
    starts, t = [], 0.0
    for duration, _ in scenes:
        starts.append(t)
        t += duration
    return starts


def make_video(
    path: Path,
    scenes: Sequence[Scene],
    fps: float = 10,
    size: tuple[int, int] = (64, 48),
    *,
    codec: str = "mpeg4",
    noise: float = 4.0,
    options: dict[str, str] | None = None,
) -> Path:
    """Encode ``scenes`` (``(duration_s, rgb)`` each) at ``fps`` (an int or a Fraction such as 30000/1001) and
    ``size`` (width, height) into ``path``; the container follows the suffix (``.mp4``, ``.mkv``, ``.ts``, ...).
    Frame i is at ``i / fps`` seconds and shows the scene that covers that time. ``options``: muxer options, e.g.
    ``{"movflags": "faststart"}`` (an MP4 whose index comes first, so a cut copy still plays)."""
    import av

    rate = Fraction(fps).limit_denominator(1001)
    total = sum(d for d, _ in scenes)
    starts = scene_starts(scenes)
    n = int(round(total * rate))
    with av.open(str(path), mode="w", options=options or {}) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.bit_rate = 4_000_000  # high enough that every frame (the noise) takes real bytes: cuts land mid-video
        stream.codec_context.gop_size = 10
        for i in range(n):
            t = float(i / rate)
            k = max(j for j, start in enumerate(starts) if start <= t + 1e-9)
            image = scene_frame(scenes[k][1], size, noise=noise, seed=i)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def make_vfr_video(
    path: Path, times: Sequence[float], size: tuple[int, int] = (64, 48), *, codec: str = "mpeg4", rate: int = 30
) -> Path:
    """Encode one frame at each of ``times`` (seconds, increasing, on a millisecond clock) into ``path``: a
    variable-frame-rate video (a phone's or a screen capture's) whose nominal ``rate`` says nothing of its gaps. The
    frames cycle through :data:`COLOURS`."""
    import av

    millis = Fraction(1, 1000)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.codec_context.time_base = millis
        for i, t in enumerate(times):
            frame = av.VideoFrame.from_ndarray(scene_frame(COLOURS[i % 3], size, noise=4.0, seed=i), format="rgb24")
            frame.pts, frame.time_base = round(t * 1000), millis
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def truncate(src: Path, dst: Path, fraction: float = 0.5) -> Path:
    """``dst``: the first ``fraction`` of ``src``'s bytes (a download or a recording cut short)."""
    data = src.read_bytes()
    dst.write_bytes(data[: int(len(data) * fraction)])
    return dst


def corrupt(src: Path, dst: Path, frame: int, seed: int = 0) -> Path:
    """``dst``: ``src`` with the payload of frame ``frame``'s packet overwritten by random bytes (its first 8 bytes,
    the start code, kept). FFmpeg conceals damage to a frame other frames predict from the one before, but a
    damaged key frame (every 10th frame of :func:`make_video`'s MPEG-4, and each scene's first) is a decoding error:
    that is the corrupt file a stream must stop at."""
    import av

    with av.open(str(src)) as container:
        packets = [(p.pos, p.size) for p in container.demux(container.streams.video[0]) if p.size]
    pos, size = packets[frame]
    keep = min(8, size // 4)
    data = bytearray(src.read_bytes())
    data[pos + keep : pos + size] = np.random.default_rng(seed).integers(0, 256, size - keep, dtype=np.uint8).tobytes()
    dst.write_bytes(bytes(data))
    return dst


def decoded_times(path: Path) -> list[float]:
    """Every frame's presentation time (seconds) as PyAV reports it, independently of the stream sources."""
    import av

    with av.open(str(path)) as container:
        return [float(frame.time) for frame in container.decode(container.streams.video[0])]
