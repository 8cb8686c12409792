"""The one thing every frame source yields: a decoded picture and where it sits in the stream.

A plain frozen dataclass, so that sources, the sampler, the pipeline and user code written around their own capture
loop agree on one shape without importing any video library.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Frame"]


@dataclass(frozen=True)
class Frame:
    """One decoded frame.

    Attributes:
        image: the picture, an H×W×3 ``uint8`` RGB array.
        pts_s: its timestamp in the stream, in seconds (a file's presentation time; for a live source the capture
            time since the stream began). Sampling runs on this clock, never on wall time.
        index: its index in the source (0 for the first frame; every decoded frame counts, sampled or not).
    """

    image: np.ndarray
    pts_s: float
    index: int
