"""Synthetic video for the stream benchmark (:mod:`tools.stream`): the built-in dataset's scenes as camera
footage, written with PyAV, and a live source that plays them at a frame rate.

A scene is one image of the synthetic dataset (:mod:`edgecap.workshop.data.synthetic`: what the bundled models were
trained on, so their captions mean something), rendered once, centred on a 640×480 canvas (the backbone's centre
crop keeps the scene) and given fresh sensor noise in every frame, so a static camera's frames are never identical,
as a real camera's are not. A clip holds one scene (a static camera) or changes scene at known times.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Clip", "LiveClip", "clip_frames", "render_scenes", "write_clip"]

#: Noise fields drawn once per clip; each frame adds one picked at random.
_NOISE_FIELDS = 8


@dataclass(frozen=True)
class Clip:
    """A clip's layout: ``fps`` frames per second for ``seconds``, showing ``scenes[k]`` from ``changes_s[k]``."""

    seconds: float
    fps: float
    width: int
    height: int
    changes_s: tuple[float, ...]
    noise: float = 3.0

    @property
    def frames(self) -> int:
        return int(round(self.seconds * self.fps))

    def scene_at(self, t: float) -> int:
        """The scene shown at ``t`` seconds."""
        return max(k for k, start in enumerate(self.changes_s) if start <= t + 1e-9)


def render_scenes(count: int, seed: int, height: int = 480) -> list[np.ndarray]:
    """``count`` scenes of the synthetic dataset, ``height`` pixels square, as H×W×3 uint8."""
    from edgecap.workshop.data.synthetic import render_scene, sample_scene

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        scene = sample_scene(rng, size=height)
        out.append(np.asarray(render_scene(scene, rng=rng), dtype=np.uint8))
    return out


def _canvas(scene: np.ndarray, width: int, height: int) -> np.ndarray:
    """The scene centred on a ``width`` × ``height`` frame, its edges extended sideways."""
    pad = width - scene.shape[1]
    left = pad // 2
    return np.pad(scene, ((0, 0), (left, pad - left), (0, 0)), mode="edge")[:height]


def clip_frames(clip: Clip, scenes: Sequence[np.ndarray], seed: int = 0) -> Iterator[np.ndarray]:
    """Every frame of ``clip``: its scene at that time plus Gaussian noise (``clip.noise`` levels), drawn from a few
    precomputed noise fields so a frame costs an addition, not a random draw of its every pixel."""
    rng = np.random.default_rng(seed)
    canvases = [_canvas(s, clip.width, clip.height).astype(np.int16) for s in scenes]
    shape = canvases[0].shape
    fields = (
        [rng.normal(0.0, clip.noise, size=shape).astype(np.int16) for _ in range(_NOISE_FIELDS)] if clip.noise else []
    )
    for i in range(clip.frames):
        base = canvases[clip.scene_at(i / clip.fps)]
        frame = base + fields[int(rng.integers(len(fields)))] if fields else base
        yield np.clip(frame, 0, 255).astype(np.uint8)


def write_clip(path: Path, clip: Clip, scenes: Sequence[np.ndarray], seed: int = 0) -> Path:
    """Write ``clip`` as H.264 (yuv420p) in an MP4 at ``path`` with PyAV (the ``[stream]`` extra)."""
    import av

    with av.open(str(path), mode="w") as container:
        video = container.add_stream("libx264", rate=int(round(clip.fps)))
        video.width, video.height, video.pix_fmt = clip.width, clip.height, "yuv420p"
        video.options = {"preset": "veryfast", "crf": "23"}
        for image in clip_frames(clip, scenes, seed):
            for packet in video.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in video.encode():
            container.mux(packet)
    return path


class LiveClip:
    """A live ``FrameSource`` (``live=True``) playing ``clip`` at its frame rate in wall time: a camera that does not
    wait for the captioner. Frames carry their capture time since the start as ``pts_s``."""

    def __init__(self, clip: Clip, scenes: Sequence[np.ndarray], seed: int = 0) -> None:
        self.name, self.live, self.fps = "live synthetic camera", True, clip.fps
        self.clip, self.scenes, self.seed = clip, scenes, seed
        self.closed = False

    def __iter__(self) -> Iterator[Any]:
        from edgecap.runtime.stream.frames import Frame

        start = time.perf_counter()
        for i, image in enumerate(clip_frames(self.clip, self.scenes, self.seed)):
            due = start + i / self.clip.fps
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            if self.closed:
                return
            yield Frame(image=image, pts_s=time.perf_counter() - start, index=i)

    def close(self) -> None:
        self.closed = True
