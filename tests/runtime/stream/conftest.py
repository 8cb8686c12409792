"""Session-wide clips for the stream tests (built once with PyAV; tests/runtime/stream/videos.py builds others)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runtime.stream.videos import COLOURS, make_video

#: The scenes of :func:`scenes_clip`: 2 s red, 2 s blue, 1 s green, 3 s red again (changes at 2, 4 and 5 s).
SCENES = [(2.0, COLOURS[0]), (2.0, COLOURS[1]), (1.0, COLOURS[2]), (3.0, COLOURS[0])]


@pytest.fixture(scope="session")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stream-clips")


@pytest.fixture(scope="session")
def scenes_clip(clip_dir: Path) -> Path:
    """An 8 s, 10 fps, 64×48 MPEG-4 clip of :data:`SCENES` in Matroska."""
    return make_video(clip_dir / "scenes.mkv", SCENES, fps=10)
