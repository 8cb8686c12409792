"""GStreamer pipelines through OpenCV: the one way to reach a Jetson CSI camera (``nvarguscamerasrc``) and the
hardware decoders of JetPack, whose OpenCV is built with GStreamer; a pip ``opencv-python`` wheel is not.

OpenCV reports a pipeline it cannot start only as a capture that is not open, so the checks here come first: OpenCV
present, built with GStreamer, and then the pipeline itself; each failure says which of the three to fix.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from edgecap.runtime.stream.errors import StreamSourceError, stopped
from edgecap.runtime.stream.frames import Frame

__all__ = ["GStreamerSource", "gstreamer_support", "open_gstreamer"]

_NEEDS = (
    "a GStreamer pipeline needs OpenCV built with GStreamer (JetPack's OpenCV is; the pip opencv-python wheels are "
    "not): on a Jetson use the system python3-opencv, elsewhere build OpenCV with -D WITH_GSTREAMER=ON"
)


def gstreamer_support() -> tuple[Any, str]:
    """``(cv2, "")`` when OpenCV with GStreamer is importable, else ``(None, why not)``."""
    try:
        import cv2
    except ImportError:
        return None, f"OpenCV (cv2) is not installed; {_NEEDS}"
    info = cv2.getBuildInformation()
    line = next((ln for ln in info.splitlines() if ln.strip().startswith("GStreamer:")), "")
    if "YES" not in line.upper():
        return None, f"this OpenCV ({cv2.__version__}) is built without GStreamer; {_NEEDS}"
    return cv2, ""


def open_gstreamer(pipeline: str, *, live: bool) -> GStreamerSource:
    """Open a pipeline ending in ``appsink`` (added when missing), e.g. ``nvarguscamerasrc ! nvvidconv !
    video/x-raw,format=BGRx ! videoconvert ! video/x-raw,format=BGR``."""
    cv2, why = gstreamer_support()
    if cv2 is None:
        raise StreamSourceError(f"{pipeline}: {why}")
    spec = pipeline if "appsink" in pipeline else f"{pipeline} ! appsink drop=false"
    capture = cv2.VideoCapture(spec, cv2.CAP_GSTREAMER)
    if not capture.isOpened():
        capture.release()
        raise StreamSourceError(f"{pipeline}: GStreamer could not start the pipeline (run it with gst-launch-1.0)")
    return GStreamerSource(pipeline, cv2, capture, live=live)


class GStreamerSource:
    """Frames of an OpenCV GStreamer capture; ``pts_s`` is the pipeline's position (``CAP_PROP_POS_MSEC``), or the
    arrival time since the first frame when it gives none."""

    def __init__(self, name: str, cv2: Any, capture: Any, *, live: bool) -> None:
        self.name, self.live, self._cv2, self._capture = name, live, cv2, capture
        fps = float(capture.get(cv2.CAP_PROP_FPS) or 0.0)
        self.fps: float | None = fps if fps > 0 else None
        self._closed = False

    def __iter__(self) -> Iterator[Frame]:
        cv2 = self._cv2
        index, pts_s, first, started = -1, None, None, time.monotonic()
        while not self._closed:
            ok, bgr = self._capture.read()
            if not ok:
                if index < 0:
                    raise StreamSourceError(stopped(self.name, index, pts_s, "the pipeline gave no frame"))
                return  # the end of the stream (a file pipeline), or the pipeline stopped
            index += 1
            msec = float(self._capture.get(cv2.CAP_PROP_POS_MSEC) or 0.0)
            now = msec / 1000.0 if msec > 0 else time.monotonic() - started
            first = now if first is None else first
            pts_s = now - first
            yield Frame(image=cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), pts_s=pts_s, index=index)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._capture.release()
