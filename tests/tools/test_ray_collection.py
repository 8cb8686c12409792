"""The Ray benchmark's own pieces without Ray: its synthetic images and its direct arm (the Ray arm is
``caption_with_ray``, tested on a local cluster in tests/runtime/collections/test_ray_job.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from tools.ray_collection import direct_arm, make_images


def test_the_images_are_small_pngs_in_listing_order(tmp_path: Path) -> None:
    paths = make_images(tmp_path, 502, size=8)
    assert paths == sorted(paths) and len(paths) == 502 and len(set(paths)) == 502
    assert sorted(p.name for p in tmp_path.iterdir()) == ["000", "001"]
    assert Image.open(paths[-1]).size == (8, 8)


def test_the_direct_arm_writes_a_line_per_image_with_the_captioner_captions(
    tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    from edgecap.runtime.captioner import Captioner
    from tests.runtime.bundle.helpers import pixel_bundle

    bundle, _ = pixel_bundle(tiny_data, tmp_path_factory)
    paths = make_images(tmp_path / "images", 5, size=16)
    out = tmp_path / "direct.jsonl"
    captions = direct_arm(paths, out, str(bundle), "fp32", cpus=1)
    with Captioner.load(bundle, precision="fp32", threads=1) as cap:
        assert captions == dict(zip(paths, cap.batch(paths), strict=True))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records == [{"path": p, "caption": captions[p]} for p in paths]
