"""Every file an engine set names is read from inside the bundle: the timing cache a build reuses included."""

from __future__ import annotations

from pathlib import Path

from edgecap.runtime.engines.build import build_engines
from tests.runtime.engines.fake_trt import TIMING_HEADER
from tests.runtime.engines.test_build import bundle  # noqa: F401 - fixture

__all__ = ["bundle"]


def test_a_timing_cache_symlinked_outside_the_bundle_is_not_read(bundle: Path, tensorrt_here, tmp_path: Path):  # noqa: F811
    first = build_engines(bundle, precision="fp32", max_batch=2, beam=2)
    outside = tmp_path / "outside.cache"
    outside.write_bytes(b"EVIL")
    (first.folder / "timing.cache").unlink()
    (first.folder / "timing.cache").symlink_to(outside)
    said: list[str] = []
    again = build_engines(bundle, precision="fp32", max_batch=2, beam=2, rebuild=True, progress=said.append)
    fresh = TIMING_HEADER + b"10.3.0\n++"
    assert (again.folder / "timing.cache").read_bytes() == fresh  # built from an empty cache, not from "EVIL"
    assert any("ignoring the timing cache" in line and "outside" in line for line in said), said
