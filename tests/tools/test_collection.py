"""The collection benchmark's own pieces: the synthetic images it captions and its exactly-once count."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from tools.collection import check_once, generate_images


def test_the_images_are_small_pngs_in_folders_of_a_thousand(tmp_path: Path) -> None:
    generate_images(tmp_path, 1002, size=8)
    folders = sorted(p.name for p in tmp_path.iterdir())
    assert folders == ["0000", "0001"] and len(list((tmp_path / "0001").iterdir())) == 2
    assert Image.open(tmp_path / "0000" / "0000000.png").size == (8, 8)


def test_the_exactly_once_count_sees_a_duplicate_and_a_missing_image(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    records = [{"path": "a", "caption": "x"}, {"path": "b", "error": "bad"}, {"path": "a", "caption": "x"}]
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert check_once(out, 3) == {"lines": 3, "distinct_paths": 2, "expected": 3, "errors": 1}
