"""The listing: one fixed order (path parts, sorted), streamed, resumable from any listed path."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

from edgecap.runtime.collections.listing import Collection, CollectionError


def _touch(root: Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")


def test_the_walk_yields_images_in_path_part_order_and_enters_folders_at_their_place(tmp_path: Path) -> None:
    _touch(tmp_path, "b.png", "a.jpg", "a/z.PNG", "a/b/c.webp", "a.b/x.png", "notes.txt", "A.JPEG", "ab/y.bmp")
    listed = [os.path.relpath(p, tmp_path) for _, p in Collection.of([tmp_path], recursive=True)]
    assert listed == ["A.JPEG", "a/b/c.webp", "a/z.PNG", "a.b/x.png", "a.jpg", "ab/y.bmp", "b.png"]
    keys = [key for key, _ in Collection.of([tmp_path], recursive=True)]
    assert keys == sorted(keys)
    assert [Path(p).name for _, p in Collection.of([tmp_path])] == ["A.JPEG", "a.jpg", "b.png"]  # not recursive


def test_sources_keep_their_order_and_a_named_file_is_listed_whatever_its_suffix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _touch(tmp_path, "z/1.png", "a/2.png", "scan.raw")
    collection = Collection.of([tmp_path / "z", tmp_path / "scan.raw", tmp_path / "a"])
    assert [os.path.relpath(p, tmp_path) for _, p in collection] == ["z/1.png", "scan.raw", "a/2.png"]
    monkeypatch.chdir(tmp_path)
    assert [p for _, p in Collection.of(["./z/"])] == ["z/1.png"]  # as str(Path(source) / name)


def test_the_listing_is_a_generator_and_memory_stays_flat_in_the_image_count(tmp_path: Path) -> None:
    for count, name in ((1_000, "small"), (10_000, "large")):
        for folder in range(count // 100):
            _touch(tmp_path / name, *(f"d{folder:04d}/{i:03d}.png" for i in range(100)))
    peaks = {}
    for name in ("small", "large"):
        listing = iter(Collection.of([tmp_path / name], recursive=True))
        assert next(listing)[1].endswith("000.png")  # streamed: the first image before the walk is done
        tracemalloc.start()
        seen = sum(1 for _ in listing) + 1
        peaks[name] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert seen == (1_000 if name == "small" else 10_000)
    assert peaks["large"] < 1.5 * peaks["small"] + 64 * 1024, peaks  # 10x the images, not 10x the memory


def test_resuming_after_a_key_lists_exactly_the_rest(tmp_path: Path) -> None:
    _touch(tmp_path / "d", "a/1.png", "a/2.png", "b/1.png", "c.png")
    _touch(tmp_path, "e.png")
    collection = Collection.of([tmp_path / "d", tmp_path / "e.png"], recursive=True)
    everything = [p for _, p in collection]
    for i, path in enumerate(everything):
        key = collection.key(path)
        assert [p for _, p in collection.after(key)] == everything[i + 1 :]
        assert collection.count(key) == len(everything) - i - 1


def test_a_path_of_other_sources_is_refused_when_resuming(tmp_path: Path) -> None:
    _touch(tmp_path, "a/1.png", "b/1.png")
    collection = Collection.of([tmp_path / "a"])
    with pytest.raises(CollectionError, match="same paths"):
        collection.key(str(tmp_path / "b" / "1.png"))
    with pytest.raises(CollectionError, match="same paths"):  # a sub-folder's image, but not --recursive
        Collection.of([tmp_path]).key(str(tmp_path / "a" / "1.png"))


@pytest.mark.parametrize("second", ["a", "a/sub", "a/sub/1.png"])
def test_overlapping_or_missing_sources_are_refused(tmp_path: Path, second: str) -> None:
    _touch(tmp_path, "a/sub/1.png")
    with pytest.raises(CollectionError, match="give each image once"):
        Collection.of([tmp_path / "a", tmp_path / second], recursive=True)
    with pytest.raises(CollectionError, match="no such file"):
        Collection.of([tmp_path / "missing"])


def test_the_output_and_its_temporary_files_are_never_listed(tmp_path: Path) -> None:
    _touch(tmp_path, "a.png", "sub/out.png", "sub/.out.png.1a2b.png", "sub/z.png", "out.png", ".out.png.lock.jpg")
    listed = [os.path.relpath(p, tmp_path) for _, p in Collection.of([tmp_path], True, output=tmp_path / "sub/out.png")]
    assert listed == [".out.png.lock.jpg", "a.png", "out.png", "sub/z.png"]  # only the output's own are hidden
    linked = tmp_path / "linked"
    linked.symlink_to(tmp_path / "sub", target_is_directory=True)
    through_link = Collection.of([tmp_path / "sub"], output=linked / "out.png")  # the same file by another name
    assert [os.path.basename(p) for _, p in through_link] == ["z.png"]


def test_an_output_that_is_one_of_the_sources_is_refused(tmp_path: Path) -> None:
    _touch(tmp_path, "a.png", "b.png", "dir/c.png")
    with pytest.raises(CollectionError, match="is one of the images given"):
        Collection.of([tmp_path / "a.png", tmp_path / "b.png"], output=tmp_path / "b.png")
    os.link(tmp_path / "a.png", tmp_path / "hard.png")
    with pytest.raises(CollectionError, match=r"is one of the images given \(.*a\.png\)"):
        Collection.of([tmp_path / "a.png"], output=tmp_path / "hard.png")
    with pytest.raises(CollectionError, match="is a directory given to caption"):
        Collection.of([tmp_path / "dir"], output=tmp_path / "dir")
