"""Open whatever a user points a stream at (a video file, an RTSP/HTTP URL, a V4L2 camera, a GStreamer pipeline, an
image folder or glob) as one kind of thing: a :class:`FrameSource` that yields :class:`Frame` s.

The video kinds go through PyAV (``av``, the ``[stream]`` extra; its wheels bundle FFmpeg) and GStreamer pipelines
through OpenCV; both are imported only by the modules that open those kinds (``sources_av``, ``sources_cv``), so a
runtime-only install without them still imports this module, reads image folders and says what to install for the
rest. Every failure is a :class:`StreamSourceError` naming the source, so a user with four cameras knows which one.
"""

from __future__ import annotations

import glob
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from edgecap.runtime.stream.errors import StreamSourceError, stopped
from edgecap.runtime.stream.frames import Frame

__all__ = ["FrameSource", "ImageSequence", "StreamSourceError", "open_source"]

#: Seconds to wait for a network source or a camera to open, and then for each of its frames (``timeout_s``).
DEFAULT_TIMEOUT_S = 10.0
#: URL schemes read through FFmpeg as live network streams.
LIVE_SCHEMES = ("rtsp", "rtsps", "rtmp", "rtmps", "udp", "tcp", "srt", "http", "https")
#: Image suffixes an image folder is made of (the sequence's frames, in name order).
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif", ".ppm", ".pgm")
_CAMERA = re.compile(r"^/dev/video\d+$")
_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


@runtime_checkable
class FrameSource(Protocol):
    """Frames from one source, in stream order.

    Attributes:
        name: what the user named (a path, URL, ``/dev/video0``, pipeline): error messages and summaries use it.
        live: True for cameras and network streams (they cannot wait: a pipeline drops samples when it falls behind),
            False for files and folders (read at the consumer's pace, nothing dropped).
        fps: the nominal frame rate, or None when the source does not say.
    """

    name: str
    live: bool
    fps: float | None

    def __iter__(self) -> Iterator[Frame]: ...

    def close(self) -> None: ...


def open_source(
    spec: str | int | Path,
    *,
    live: bool | None = None,
    sequence_fps: float = 1.0,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> FrameSource:
    """Open ``spec`` as a frame source; a :class:`StreamSourceError` naming it when it cannot be opened.

    Args:
        spec: a video file (any format FFmpeg reads); an ``rtsp://``, ``http(s)://`` (or other FFmpeg network) URL;
            a V4L2 camera, ``/dev/videoN`` or the index N; a GStreamer pipeline (a string with ``!``, read by
            OpenCV built with GStreamer, as JetPack's is); an image folder or a glob (``frames/*.jpg``), a sequence.
        live: overrides the kind's default (cameras and URLs live, files and folders not), e.g. ``live=False`` for
            a recorded file served over HTTP that may be read as fast as the model goes.
        sequence_fps: the frame rate of an image sequence (frame i is at ``i / sequence_fps`` seconds).
        timeout_s: a network source or camera that does not open, or stops delivering frames, for this many seconds
            is an error rather than a wait forever.
    """
    if isinstance(spec, bool) or not isinstance(spec, (str, int, os.PathLike)):
        raise StreamSourceError(f"a stream source is a path, URL, camera or pipeline, not {type(spec).__name__}")
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
        raise StreamSourceError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    if isinstance(spec, int):
        if spec < 0:
            raise StreamSourceError(f"camera index {spec}: an index is >= 0")
        spec = f"/dev/video{spec}"
    text = os.fspath(spec)
    if not text.strip():
        raise StreamSourceError("an empty stream source")
    scheme = _URL.match(text)
    if scheme is not None and scheme.group(1).lower() != "file":
        from edgecap.runtime.stream.sources_av import open_av

        if scheme.group(1).lower() not in LIVE_SCHEMES:
            raise StreamSourceError(f"{text}: unsupported URL scheme {scheme.group(1)!r} (use one of {LIVE_SCHEMES})")
        return open_av(text, kind="url", live=True if live is None else live, timeout_s=timeout_s)
    if "!" in text and scheme is None and not Path(text).exists():
        from edgecap.runtime.stream.sources_cv import open_gstreamer

        return open_gstreamer(text, live=True if live is None else live)
    if _CAMERA.match(text):
        from edgecap.runtime.stream.sources_av import open_av

        return open_av(text, kind="camera", live=True if live is None else live, timeout_s=timeout_s)
    path = Path(text[len("file://") :] if scheme is not None else text)
    if path.is_dir():
        return ImageSequence.from_folder(path, fps=sequence_fps, live=bool(live))
    if glob.has_magic(str(path)) and not path.exists():
        return ImageSequence.from_glob(str(path), fps=sequence_fps, live=bool(live))
    if not path.exists():
        raise StreamSourceError(f"{text}: no such file, folder, camera or URL")
    if not path.is_file():
        raise StreamSourceError(f"{text}: not a file, a folder, a camera or a URL")
    from edgecap.runtime.stream.sources_av import open_av

    return open_av(str(path), kind="file", live=bool(live), timeout_s=timeout_s)


class ImageSequence:
    """Image files taken as the frames of a video: frame i is at ``i / fps`` seconds (``--fps-of-sequence``).

    A file that cannot be read as an image ends the stream with a :class:`StreamSourceError` after the frames
    before it, as a corrupt frame of a video file does: a folder is a recording, and a hole in it is worth knowing.
    """

    def __init__(self, name: str, paths: list[Path], *, fps: float = 1.0, live: bool = False) -> None:
        if not (isinstance(fps, (int, float)) and math.isfinite(fps) and fps > 0):
            raise StreamSourceError(f"{name}: the sequence's frame rate must be a positive number, got {fps!r}")
        if not paths:
            raise StreamSourceError(f"{name}: no images ({', '.join(IMAGE_SUFFIXES)})")
        self.name, self.paths, self.live = name, paths, live
        self.fps: float | None = float(fps)
        self._closed = False

    @classmethod
    def from_folder(cls, folder: Path, *, fps: float = 1.0, live: bool = False) -> ImageSequence:
        """The folder's image files (by suffix), in name order; sub-folders are not read."""
        try:
            paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        except OSError as exc:
            raise StreamSourceError(f"{folder}: cannot list the folder: {exc.strerror or exc}") from None
        return cls(str(folder), paths, fps=fps, live=live)

    @classmethod
    def from_glob(cls, pattern: str, *, fps: float = 1.0, live: bool = False) -> ImageSequence:
        """The files ``pattern`` matches, in name order (every match is taken as an image)."""
        paths = sorted(Path(p) for p in glob.glob(pattern) if Path(p).is_file())
        if not paths:
            raise StreamSourceError(f"{pattern}: no file matches")
        return cls(pattern, paths, fps=fps, live=live)

    def __iter__(self) -> Iterator[Frame]:
        from edgecap.runtime.images.load import ImageError, load_image

        rate = self.fps or 1.0
        for index, path in enumerate(self.paths):
            if self._closed:
                return
            try:
                image = np.asarray(load_image(path), dtype=np.uint8)
            except (ImageError, OSError) as exc:
                reason = f"{path}: {exc}"
                raise StreamSourceError(stopped(self.name, index - 1, (index - 1) / rate, reason)) from None
            yield Frame(image=image, pts_s=index / rate, index=index)

    def close(self) -> None:
        self._closed = True
