"""A collection run: every image once, in listing order, whatever the workers; resumable; bad images are lines."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from edgecap.runtime.captioner import Captioner
from edgecap.runtime.collections import Collection, WorkerSpec, caption_collection
from tests.runtime.bundle.helpers import pixel_bundle
from tests.runtime.collections.helpers import make_collection


@pytest.fixture(scope="module")
def bundle(tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pixel_bundle(tiny_data, tmp_path_factory)[0]


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    root = tmp_path_factory.mktemp("photos")
    return root, make_collection(root, 30, folders=3, bad=2)


def test_two_workers_write_the_same_lines_as_one_and_as_a_direct_batch(
    bundle: Path, photos: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    root, paths = photos
    spec = WorkerSpec(bundle=str(bundle), load={"threads": 1})
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}.jsonl"
        summary = caption_collection(Collection.of([root], recursive=True), out, spec, workers=workers, chunk=3,
                                     stream=io.StringIO())  # fmt: skip
        assert (summary.written, summary.errors, summary.resumed) == (32, 2, False)
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    records = [json.loads(line) for line in outs[0].splitlines()]
    assert [r["path"] for r in records] == [str(p) for p in paths]  # listing order, each once
    with Captioner.load(bundle, threads=1) as captioner:
        good = [p for p in paths if p.suffix == ".png"]
        expected = dict(zip(map(str, good), captioner.batch([str(p) for p in good]), strict=True))
    for record in records:
        if record["path"].endswith(".jpg"):
            assert list(record) == ["path", "error"] and record["path"] in record["error"]
        else:
            assert list(record) == ["path", "caption"] and record["caption"] == expected[record["path"]]


def test_resume_writes_exactly_the_lines_a_stopped_run_had_left(
    bundle: Path, photos: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    root, _ = photos
    spec = WorkerSpec(bundle=str(bundle), load={"threads": 1})
    collection = Collection.of([root], recursive=True)
    full = tmp_path / "full.jsonl"
    caption_collection(collection, full, spec, progress=False)
    lines = full.read_bytes().splitlines(keepends=True)
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"".join(lines[:11]) + lines[11][:20])  # killed in the middle of line 12
    summary = caption_collection(collection, out, spec, workers=2, resume=True, chunk=4, progress=False)
    assert (summary.written, summary.resumed) == (len(lines) - 11, True)
    assert out.read_bytes() == full.read_bytes()
    again = caption_collection(collection, out, spec, resume=True, progress=False)
    assert (again.written, again.runtime) == (0, "")  # nothing left: no worker started
    assert out.read_bytes() == full.read_bytes()


def test_resume_recaptions_the_image_of_a_damaged_middle_line_and_says_so(
    bundle: Path, photos: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    root, _ = photos
    spec = WorkerSpec(bundle=str(bundle), load={"threads": 1})
    collection = Collection.of([root], recursive=True)
    full = tmp_path / "full.jsonl"
    caption_collection(collection, full, spec, progress=False)
    lines = full.read_bytes().splitlines(keepends=True)

    out = tmp_path / "out.jsonl"  # line 5 garbled, then killed in the middle of line 21
    out.write_bytes(b"".join(lines[:4]) + b"\x00#garbage{\n" + b"".join(lines[5:20]) + lines[20][:9])
    told = io.StringIO()
    summary = caption_collection(collection, out, spec, resume=True, chunk=4, progress=False, stream=told)
    assert out.read_bytes() == full.read_bytes()  # every image once, in listing order, the damaged one again
    assert (summary.written, summary.dropped, summary.redone) == (len(lines) - 20 + 1, 1, 1)
    assert "1 damaged line(s) (line 5) dropped; 1 image(s) before its last line had no line" in told.getvalue()
    assert "1 damaged line(s) dropped, 1 image(s) captioned again" in summary.describe(out)

    out.write_bytes(b"".join(lines[:3]) + b"not json\n" + b"".join(lines[3:]))  # a line too many: nothing lost
    summary = caption_collection(collection, out, spec, resume=True, progress=False, stream=io.StringIO())
    assert (summary.written, summary.dropped, summary.redone, summary.runtime) == (0, 1, 0, "")
    assert out.read_bytes() == full.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full.jsonl", "out.jsonl"]  # no temporary file left


def test_the_output_inside_the_collection_is_never_captioned(
    bundle: Path, photos: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    root = tmp_path / "photos"
    shutil.copytree(photos[0] / "f00", root)
    out = root / "captions.png"  # an image's name: the listing would take it, were it not the output
    spec = WorkerSpec(bundle=str(bundle), load={"threads": 1})
    caption_collection(Collection.of([root]), out, spec, progress=False)
    paths = [json.loads(line)["path"] for line in out.read_text().splitlines()]
    assert paths == sorted(str(p) for p in root.iterdir() if p != out) and str(out) not in paths
    again = caption_collection(Collection.of([root]), out, spec, resume=True, progress=False)
    assert again.written == 0
