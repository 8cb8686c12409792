"""Tests of the synthetic scene-captioning dataset: determinism, format, caption truth, splits, stats."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgecap.workshop.data.synthetic import (
    COLOURS,
    LENGTH_LEVELS,
    SHAPES,
    Background,
    Scene,
    SceneError,
    SceneObject,
    SynthError,
    dataset_stats,
    describe_scene,
    generate_dataset,
    is_next_to,
    length_level,
    position_region,
    render_scene,
    sample_scene,
    spatial_relation,
    split_counts,
)
from edgecap.workshop.data.synthetic._scene import crop_box

SIZE = 256
_SIZE_WORDS = {"small": "small|little", "medium": "medium sized|medium", "large": "large|big"}
_WORD_TO_SIZE = {w: s for s, ws in _SIZE_WORDS.items() for w in ws.split("|")}
_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4}
_PLURAL_TO_SHAPE = {p: s for s, p in SHAPES.items()}
_COLOUR_RE = "|".join(COLOURS)
_SHAPE_RE = "|".join(sorted([*SHAPES, *SHAPES.values()], key=len, reverse=True))
_SIZE_RE = "medium sized|medium|small|little|large|big"
_NP = rf"(?:(?P<{{p}}size>{_SIZE_RE}) )?(?P<{{p}}colour>{_COLOUR_RE}) (?P<{{p}}shape>{_SHAPE_RE})"


def _np(prefix: str) -> str:
    return _NP.replace("{p}", prefix)


_RELATION_WORDS = {
    "to the left of": "left",
    "left of": "left",
    "to the right of": "right",
    "right of": "right",
    "above": "above",
    "below": "below",
    "under": "below",
    "beneath": "below",
    "next to": "next",
    "beside": "next",
}
_REL_RE = re.compile(
    rf"\b(?:a|an|the) {_np('a')} (?:is )?(?P<rel>to the left of|left of|to the right of|right of|above|below|under"
    rf"|beneath|next to|beside) (?:a|an|the) {_np('b')}\b"
)
_SIDE_BY_SIDE = r"(?:next to each other|side by side)"
_PAIR_NEXT_RE = re.compile(rf"\b(?:a|an|the) {_np('a')} and (?:a|an|the) {_np('b')} {_SIDE_BY_SIDE}")
_GROUP_NEXT_RE = re.compile(rf"\btwo {_np('a')} {_SIDE_BY_SIDE}")
_POSITION_WORDS = {
    "in the top left corner": ("top", "left"),
    "in the upper left corner": ("top", "left"),
    "at the top": ("top", "center"),
    "near the top": ("top", "center"),
    "in the top right corner": ("top", "right"),
    "in the upper right corner": ("top", "right"),
    "on the left side": ("middle", "left"),
    "on the left": ("middle", "left"),
    "in the center": ("middle", "center"),
    "in the middle": ("middle", "center"),
    "on the right side": ("middle", "right"),
    "on the right": ("middle", "right"),
    "in the bottom left corner": ("bottom", "left"),
    "in the lower left corner": ("bottom", "left"),
    "at the bottom": ("bottom", "center"),
    "near the bottom": ("bottom", "center"),
    "in the bottom right corner": ("bottom", "right"),
    "in the lower right corner": ("bottom", "right"),
}
_POS_RE = re.compile(
    rf"\b{_np('a')} (?:is )?(?P<pos>" + "|".join(sorted(_POSITION_WORDS, key=len, reverse=True)) + r")\b"
)
_COUNT_RE = re.compile(
    rf"\b(?P<num>one|two|three|four) (?P<other>other )?(?:(?P<size>{_SIZE_RE}) )?(?:(?P<colour>{_COLOUR_RE}) )?"
    rf"(?P<noun>{_SHAPE_RE}|shapes|shape|objects|object)\b"
)
_BACKGROUND_WORDS = {
    "gradient": {"gradient", "shaded"},
    "stripes": {"striped", "stripes"},
    "checkerboard": {"checkered", "checkerboard"},
    "noise": {"noisy", "grainy", "noise"},
    "blobs": {"blotchy", "mottled", "cloudy", "blobs", "patches"},
    "grid": {"grid"},
}


def _obj(
    shape: str = "circle", colour: str = "red", size: str = "medium", x: int = 128, y: int = 128, r: int = 22
) -> SceneObject:
    return SceneObject(shape=shape, colour=colour, size=size, x=x, y=y, radius=r)


def _pixels(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image)


def _matches(obj: SceneObject, size_word: str | None, colour: str, shape_word: str) -> bool:
    shape = _PLURAL_TO_SHAPE.get(shape_word, shape_word)
    return obj.colour == colour and obj.shape == shape and (size_word is None or obj.size == _WORD_TO_SIZE[size_word])


def _check_caption(scene: Scene, caption: str) -> None:
    """Assert every checkable statement of ``caption`` holds in ``scene``."""
    objs = scene.objects
    n = len(objs)
    where = f"{caption!r} for {scene}"
    assert caption == caption.lower() and re.fullmatch(r"[a-z]+( [a-z]+)*", caption), where

    # Every coloured noun phrase names an object (or group) that exists with those attributes.
    for m in re.finditer(rf"\b{_np('a')}\b", caption):
        assert any(_matches(o, m["asize"], m["acolour"], m["ashape"]) for o in objs), where
    # "the red circle": that colour/shape pair is unique.
    for m in re.finditer(rf"\bthe {_np('a')}\b", caption):
        pair = (m["acolour"], _PLURAL_TO_SHAPE.get(m["ashape"], m["ashape"]))
        assert sum(o.pair == pair for o in objs) == 1, where
    # Counts are exact.
    for m in _COUNT_RE.finditer(caption):
        k, noun = _NUMBERS[m["num"]], m["noun"]
        if noun in ("shape", "shapes", "object", "objects"):
            expected = sum(o.colour == m["colour"] for o in objs) if m["colour"] else n - (1 if m["other"] else 0)
            assert m["size"] is None and k == expected, where
        else:
            shape = _PLURAL_TO_SHAPE.get(noun, noun)
            members = [o for o in objs if o.shape == shape and (m["colour"] is None or o.colour == m["colour"])]
            assert k == len(members), where
            if m["size"]:
                assert all(o.size == _WORD_TO_SIZE[m["size"]] for o in members), where
    if "single" in caption.split() or "only one" in caption:
        assert n == 1, where
    # Relations hold for some pair of matching objects.
    for m in _REL_RE.finditer(caption):
        relation = _RELATION_WORDS[m["rel"]]
        ok = False
        for a in objs:
            for b in objs:
                if a is b or not _matches(a, m["asize"], m["acolour"], m["ashape"]):
                    continue
                if not _matches(b, m["bsize"], m["bcolour"], m["bshape"]):
                    continue
                if relation == "next":
                    ok |= is_next_to(a, b, scene.size)
                else:
                    ok |= spatial_relation(a, b, scene.size) == relation
        assert ok, where
    for m in _PAIR_NEXT_RE.finditer(caption):
        assert any(
            is_next_to(a, b, scene.size)
            for a in objs
            for b in objs
            if a is not b
            and _matches(a, m["asize"], m["acolour"], m["ashape"])
            and _matches(b, m["bsize"], m["bcolour"], m["bshape"])
        ), where
    for m in _GROUP_NEXT_RE.finditer(caption):
        members = [o for o in objs if _matches(o, m["asize"], m["acolour"], m["ashape"])]
        assert len(members) == 2 and is_next_to(*members, scene.size), where
    # Positions hold for some matching object.
    for m in _POS_RE.finditer(caption):
        region = _POSITION_WORDS[m["pos"]]
        assert any(
            _matches(o, m["asize"], m["acolour"], m["ashape"]) and position_region(o, scene.size) == region
            for o in objs
        ), where
    # Background words name the drawn texture.
    words = set(caption.split())
    for kind, vocab in _BACKGROUND_WORDS.items():
        if kind != scene.background.kind:
            assert not words & vocab, where
    if scene.background.kind == "stripes":
        for orientation in ("vertical", "horizontal", "diagonal"):
            if orientation in words:
                assert scene.background.orientation == orientation, where


# ------------------------------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "ds"
    generate_dataset(out, 60, seed=7, progress=False)
    return out


@pytest.fixture(scope="module")
def document(dataset_dir: Path) -> dict:
    return json.loads((dataset_dir / "dataset.json").read_text())


# ------------------------------------------------------------------------------------------------------------------
# Geometry


def test_spatial_relation_on_constructed_scenes() -> None:
    left, right = _obj(x=60, y=128), _obj(x=190, y=135)
    assert spatial_relation(left, right, SIZE) == "left"
    assert spatial_relation(right, left, SIZE) == "right"
    top, bottom = _obj(x=128, y=50), _obj(x=120, y=200)
    assert spatial_relation(top, bottom, SIZE) == "above"
    assert spatial_relation(bottom, top, SIZE) == "below"
    # Diagonal displacement: neither reading is unambiguous.
    assert spatial_relation(_obj(x=60, y=60), _obj(x=160, y=160), SIZE) is None
    # Closer than the margin along the dominant axis.
    assert spatial_relation(_obj(x=120, y=128), _obj(x=128, y=128), SIZE) is None
    # Just past the dominance threshold (dx = 1.5 dy) still counts; just below does not.
    assert spatial_relation(_obj(x=40, y=100), _obj(x=100, y=140), SIZE) == "left"
    assert spatial_relation(_obj(x=40, y=100), _obj(x=100, y=141), SIZE) is None


def test_is_next_to() -> None:
    a = _obj(x=60, y=128, r=20)
    assert is_next_to(a, _obj(x=120, y=130, r=20), SIZE)  # gap 20 px < 25.6 px
    assert not is_next_to(a, _obj(x=200, y=128, r=20), SIZE)  # gap 100 px
    assert not is_next_to(a, _obj(x=62, y=190, r=20), SIZE)  # close but stacked vertically
    assert is_next_to(_obj(x=120, y=130, r=20), a, SIZE)  # symmetric


def test_position_region() -> None:
    low, high = crop_box(SIZE)
    assert (low, high) == (16.0, 240.0)
    assert position_region(_obj(x=40, y=40), SIZE) == ("top", "left")
    assert position_region(_obj(x=128, y=128), SIZE) == ("middle", "center")
    assert position_region(_obj(x=220, y=220), SIZE) == ("bottom", "right")
    assert position_region(_obj(x=128, y=30), SIZE) == ("top", "center")
    assert position_region(_obj(x=int(low + (high - low) / 3), y=128), SIZE) is None  # on a grid line
    assert position_region(_obj(x=5, y=128), SIZE) is None  # outside the crop


def test_scene_validation() -> None:
    with pytest.raises(SceneError, match="unknown shape"):
        _obj(shape="hexagram")
    with pytest.raises(SceneError, match="unknown colour"):
        _obj(colour="teal")
    with pytest.raises(SceneError, match="orientation"):
        Background("stripes")
    with pytest.raises(SceneError, match="224"):
        Scene(size=128, background=Background("grid"), objects=(_obj(),))
    with pytest.raises(SceneError, match="objects"):
        Scene(size=SIZE, background=Background("grid"), objects=())


# ------------------------------------------------------------------------------------------------------------------
# Scenes, rendering and captions


def test_sampled_scenes_fit_the_crop_and_do_not_overlap() -> None:
    low, high = crop_box(SIZE)
    counts: Counter[int] = Counter()
    for i in range(200):
        scene = sample_scene(np.random.default_rng([3, i]), SIZE)
        counts[len(scene.objects)] += 1
        for k, o in enumerate(scene.objects):
            assert low <= o.x - o.radius and o.x + o.radius <= high and low <= o.y - o.radius <= o.y + o.radius <= high
            assert position_region(o, SIZE) is not None
            for other in scene.objects[k + 1 :]:
                assert np.hypot(o.x - other.x, o.y - other.y) > o.radius + other.radius
    assert set(counts) == {1, 2, 3, 4}


def test_sample_scene_respects_pair_constraints() -> None:
    excluded = [("red", "circle"), ("blue", "star")]
    for i in range(100):
        rng = np.random.default_rng([5, i])
        assert not any(o.pair in excluded for o in sample_scene(rng, exclude_pairs=excluded).objects)
        assert any(o.pair in excluded for o in sample_scene(rng, require_pairs=excluded).objects)
    with pytest.raises(SceneError, match="both required and excluded"):
        sample_scene(np.random.default_rng(0), exclude_pairs=excluded, require_pairs=excluded[:1])


@pytest.mark.parametrize("shape", [s for s in SHAPES if s != "ring"])
def test_render_scene_draws_the_named_colour(shape: str) -> None:
    rng = np.random.default_rng(11)
    for colour, rgb in COLOURS.items():
        obj = SceneObject(shape=shape, colour=colour, size="large", x=128, y=128, radius=36, angle=5)
        scene = Scene(size=SIZE, background=Background("noise"), objects=(obj,))
        pixels = np.asarray(render_scene(scene, SIZE, rng), dtype=np.int16)
        centre = pixels[125:132, 125:132].reshape(-1, 3).mean(axis=0)
        assert np.all(np.abs(centre - np.asarray(rgb)) <= 20), (shape, colour, centre)


def test_render_ring_shows_background_inside() -> None:
    obj = SceneObject(shape="ring", colour="red", size="large", x=128, y=128, radius=36)
    image = render_scene(Scene(size=SIZE, background=Background("gradient"), objects=(obj,)), SIZE, None)
    pixels = np.asarray(image, dtype=np.int16)
    assert np.abs(pixels[128, 128] - np.asarray(COLOURS["red"])).max() > 40  # hole
    assert np.abs(pixels[128, 128 + 28] - np.asarray(COLOURS["red"])).max() <= 20  # band at 0.78 r


def test_render_scene_is_deterministic_and_rgb() -> None:
    scene = sample_scene(np.random.default_rng(1), 300)
    a = render_scene(scene, 300, np.random.default_rng(2))
    b = render_scene(scene, 300, np.random.default_rng(2))
    assert a.mode == "RGB" and a.size == (300, 300)
    assert np.array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="differs"):
        render_scene(scene, 256, np.random.default_rng(2))


def test_length_level_boundaries() -> None:
    assert [length_level(n) for n in (1, 9, 10, 14, 15, 19, 20, 25)] == [0, 0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(ValueError):
        length_level(26)
    with pytest.raises(ValueError):
        length_level(0)


def test_captions_state_true_facts() -> None:
    """Counts, attributes, relations, positions and background words agree with the scene, over many scenes."""
    templates_seen = 0
    for i in range(150):
        rng = np.random.default_rng([9, i])
        scene = sample_scene(rng, SIZE)
        captions = describe_scene(scene, rng, n=6)
        assert len(captions) == 6 and len({tuple(c) for c in captions}) == 6
        for tokens in captions:
            assert 1 <= len(tokens) <= 25
            _check_caption(scene, " ".join(tokens))
            templates_seen += 1
    assert templates_seen == 900


def test_caption_checker_catches_false_statements() -> None:
    """The fact checker used above is not vacuous."""
    scene = Scene(
        size=SIZE,
        background=Background("stripes", "vertical"),
        objects=(_obj("circle", "red", "small", x=60, y=128, r=14), _obj("star", "blue", "large", x=190, y=128, r=36)),
    )
    _check_caption(scene, "a small red circle is to the left of a big blue star on vertical stripes")
    for false in (
        "a red circle is to the right of a blue star",
        "two red circles",
        "three shapes",
        "a large red circle",
        "a green star",
        "the blue star is in the top left corner",
        "a red circle on a checkered background",
        "a blue star with horizontal stripes in the background",
        "a single red circle",
        "a blue star and a red circle side by side",
        "two red circles next to each other",
    ):
        with pytest.raises(AssertionError):
            _check_caption(scene, false)


def test_describe_scene_validates_n() -> None:
    scene = sample_scene(np.random.default_rng(0))
    with pytest.raises(ValueError, match="1..20"):
        describe_scene(scene, np.random.default_rng(0), n=0)


# ------------------------------------------------------------------------------------------------------------------
# The dataset on disk


def test_karpathy_format(dataset_dir: Path, document: dict) -> None:
    assert document["dataset"] == "synthetic"
    images = document["images"]
    assert [e["imgid"] for e in images] == list(range(60))
    sentids = [s["sentid"] for e in images for s in e["sentences"]]
    assert len(set(sentids)) == len(sentids)
    for entry in images:
        assert {"filepath", "filename", "imgid", "cocoid", "split", "sentences", "sentids", "width", "height"} <= set(
            entry
        )
        assert entry["split"] in ("train", "val", "test")
        assert entry["sentids"] == [s["sentid"] for s in entry["sentences"]]
        assert (dataset_dir / entry["filepath"] / entry["filename"]).is_file()
        assert entry["filename"] == f"{entry['imgid']:06d}.png"
        for sentence in entry["sentences"]:
            assert sentence["imgid"] == entry["imgid"]
            assert sentence["raw"] == " ".join(sentence["tokens"])
        scene = Scene.from_dict(entry["scene"], entry["width"])
        for sentence in entry["sentences"]:
            _check_caption(scene, sentence["raw"])


def test_loads_with_the_dataset_reader(dataset_dir: Path, document: dict) -> None:
    from edgecap.workshop.data.datasets import load_dataset, load_karpathy

    dataset = load_karpathy(dataset_dir / "dataset.json", dataset_dir)
    assert len(dataset) == 60 and dataset.name == "synthetic"
    assert dataset.splits() == dict(Counter(e["split"] for e in document["images"]))
    record = dataset[0]
    assert record.path is not None and record.path.is_file() and len(record.captions) == 5
    assert len(load_dataset(dataset_dir)) == 60


def test_images_are_rgb_and_large_enough(dataset_dir: Path, document: dict) -> None:
    for entry in document["images"]:
        with Image.open(dataset_dir / entry["filepath"] / entry["filename"]) as image:
            assert image.mode == "RGB"
            assert image.size == (entry["width"], entry["height"]) and min(image.size) >= 224


def test_captions_per_image_and_lengths(document: dict) -> None:
    train_lengths = []
    for entry in document["images"]:
        captions = [tuple(s["tokens"]) for s in entry["sentences"]]
        assert len(captions) >= 5 and len(set(captions)) == len(captions)
        assert all(1 <= len(c) <= 25 for c in captions)
        if entry["split"] == "train":
            train_lengths += [len(c) for c in captions]
    share = Counter(length_level(n) for n in train_lengths)
    for level in range(len(LENGTH_LEVELS)):
        assert share[level] / len(train_lengths) >= 0.10, (level, share)


def test_same_seed_is_byte_identical_and_different_seed_differs(tmp_path: Path) -> None:
    """Same seed -> same bytes, also from a fresh interpreter with another hash seed (no set-order dependence)."""
    runs = {
        name: generate_dataset(tmp_path / name, 12, seed=seed, progress=False).parent
        for name, seed in (("a", 3), ("c", 4))
    }
    code = (
        "from edgecap.workshop.data.synthetic import generate_dataset; "
        f"generate_dataset({str(tmp_path / 'b')!r}, 12, seed=3, progress=False)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONHASHSEED": "123"})
    runs["b"] = tmp_path / "b"
    json_bytes = {name: (root / "dataset.json").read_bytes() for name, root in runs.items()}
    assert json_bytes["a"] == json_bytes["b"] and json_bytes["a"] != json_bytes["c"]
    differs = 0
    for name in (f"{i:06d}.png" for i in range(12)):
        a, b, c = ((runs[k] / "images" / name) for k in "abc")
        assert a.read_bytes() == b.read_bytes()
        assert np.array_equal(_pixels(a), _pixels(b))
        differs += not np.array_equal(_pixels(a), _pixels(c))
    assert differs == 12


def test_jpeg_format_and_image_size(tmp_path: Path) -> None:
    path = generate_dataset(tmp_path / "j", 4, seed=1, image_size=240, image_format="jpg", progress=False)
    entry = json.loads(path.read_text())["images"][0]
    assert entry["filename"].endswith(".jpg") and entry["width"] == 240
    with Image.open(path.parent / "images" / entry["filename"]) as image:
        assert image.format == "JPEG" and image.size == (240, 240) and image.mode == "RGB"


def test_split_counts() -> None:
    assert split_counts(10, (0.8, 0.1, 0.1)) == (8, 1, 1)
    assert split_counts(7, (0.5, 0.25, 0.25)) == (3, 2, 2)  # remainders .5, .75, .75
    assert sum(split_counts(2001, (0.7, 0.2, 0.1))) == 2001
    assert split_counts(5, (1.0, 0.0, 0.0)) == (5, 0, 0)
    with pytest.raises(SynthError, match="sum to 1"):
        split_counts(10, (0.5, 0.5, 0.5))
    with pytest.raises(SynthError, match="three"):
        split_counts(10, (0.5, 0.5))


def test_split_fractions_are_applied(tmp_path: Path) -> None:
    path = generate_dataset(tmp_path / "s", 20, splits=(0.5, 0.25, 0.25), progress=False)
    splits = Counter(e["split"] for e in json.loads(path.read_text())["images"])
    assert splits == {"train": 10, "val": 5, "test": 5}


def test_compositional_split_holds_out_pairs(tmp_path: Path) -> None:
    path = generate_dataset(tmp_path / "comp", 40, seed=2, compositional=True, progress=False)
    document = json.loads(path.read_text())
    heldout = [tuple(p) for p in document["heldout_pairs"]]
    assert len(heldout) == 4
    assert len({c for c, _ in heldout}) == 4 and len({s for _, s in heldout}) == 4
    assert document["generator"]["compositional"] is True
    splits = Counter()
    for entry in document["images"]:
        splits[entry["split"]] += 1
        pairs = {(o["colour"], o["shape"]) for o in entry["scene"]["objects"]}
        if entry["split"] == "train":
            assert not pairs & set(heldout)
            for sentence in entry["sentences"]:
                raw = sentence["raw"]
                for colour, shape in heldout:
                    assert not re.search(rf"\b{colour} ({shape}|{SHAPES[shape]})\b", raw), raw
        else:
            assert pairs & set(heldout)
    assert splits["val"] and splits["test"]


def test_non_compositional_has_no_heldout_pairs(document: dict) -> None:
    assert document["heldout_pairs"] == [] and document["generator"]["compositional"] is False


def test_overwrite_protection(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    generate_dataset(out, 3, seed=0, progress=False)
    before = (out / "dataset.json").read_bytes()
    with pytest.raises(FileExistsError, match="not empty"):
        generate_dataset(out, 3, seed=1, progress=False)
    assert (out / "dataset.json").read_bytes() == before
    generate_dataset(out, 4, seed=1, overwrite=True, progress=False)
    assert len(json.loads((out / "dataset.json").read_text())["images"]) == 4
    assert sorted(p.name for p in (out / "images").iterdir()) == [f"{i:06d}.png" for i in range(4)]

    # An existing empty directory is fine; a foreign non-empty one is never replaced, even with overwrite.
    empty = tmp_path / "empty"
    empty.mkdir()
    generate_dataset(empty, 2, progress=False)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="refusing"):
        generate_dataset(foreign, 2, overwrite=True, progress=False)
    assert (foreign / "notes.txt").read_text() == "keep me"
    assert not list(tmp_path.glob(".*partial"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_images": 0}, "num_images"),
        ({"seed": -1}, "seed"),
        ({"image_size": 200}, "image_size"),
        ({"splits": (0.9, 0.2, 0.1)}, "sum to 1"),
        ({"image_format": "gif"}, "image_format"),
        ({"captions_per_image": 0}, "captions_per_image"),
    ],
)
def test_invalid_arguments(tmp_path: Path, kwargs: dict, message: str) -> None:
    args = {"num_images": 2, **kwargs}
    with pytest.raises(SynthError, match=message):
        generate_dataset(tmp_path / "x", progress=False, **args)
    assert not (tmp_path / "x").exists()


def test_dataset_stats(dataset_dir: Path, document: dict) -> None:
    stats = dataset_stats(dataset_dir)
    assert stats == dataset_stats(dataset_dir / "dataset.json")
    assert stats["images"] == 60
    assert stats["splits"] == dict(Counter(e["split"] for e in document["images"]))
    lengths = [len(s["tokens"]) for e in document["images"] for s in e["sentences"]]
    assert stats["captions"] == len(lengths) == 300
    assert stats["length"]["min"] == min(lengths) and stats["length"]["max"] == max(lengths)
    assert stats["length"]["mean"] == pytest.approx(sum(lengths) / len(lengths), abs=1e-3)
    assert sum(stats["length_histogram"].values()) == 300
    assert list(stats["level_histogram"]) == ["1-9", "10-14", "15-19", "20-25"]
    assert sum(stats["level_histogram"].values()) == 300
    assert sum(stats["train_level_fraction"].values()) == pytest.approx(1.0, abs=1e-3)
    train_words = Counter(
        w for e in document["images"] if e["split"] == "train" for s in e["sentences"] for w in s["tokens"]
    )
    assert stats["vocab_size"] == sum(c >= 5 for c in train_words.values())
    assert "heldout_pairs" not in stats


def test_dataset_stats_errors(tmp_path: Path) -> None:
    from edgecap.workshop.data.datasets import DatasetError

    with pytest.raises(FileNotFoundError, match="dataset.json"):
        dataset_stats(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text('{"images": [{"split": "train"}]}')
    with pytest.raises(DatasetError, match="imgid"):
        dataset_stats(bad)
