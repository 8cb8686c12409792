"""Session-wide clips for the stream tests (built once with PyAV; tests/runtime/stream/videos.py builds others)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runtime.stream.videos import SCENES, make_video


@pytest.fixture(scope="session")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stream-clips")


@pytest.fixture(scope="session")
def scenes_clip(clip_dir: Path) -> Path:
    """An 8 s, 10 fps, 64×48 MPEG-4 clip of :data:`SCENES` in Matroska."""
    return make_video(clip_dir / "scenes.mkv", SCENES, fps=10)
