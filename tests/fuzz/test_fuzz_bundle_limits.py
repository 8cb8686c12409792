"""Hostile numbers in a bundle (``edgecap.runtime.bundle.limits``): each is refused when the bundle is opened, with an
error
naming the file and the field, before any runtime decodes or preprocesses with it.

Found by fuzzing the bundle reader and the CLI: a ``decode.max_words`` of 10^9 hung ``Captioner``, the CLI and the
torch runtime; an ``image_size`` of 10^6 grew the CLI to 21 GB; a zero ``std`` captioned with exit 0 and an empty
caption; a 5000-digit number stopped the reader with Python's int-conversion error, naming no file. Each edit keeps
the checksums right (:func:`~tests.runtime.bundle.helpers.rehash`), so only the limits can catch it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from edgecap import Captioner
from edgecap.runtime.bundle import BundleError, load_bundle
from edgecap.runtime.bundle.limits import MAX_DIM, MAX_IMAGE_SIZE, MAX_WORDS
from edgecap.runtime.bundle.manifest import MANIFEST_NAME
from tests.runtime.bundle.helpers import copy_bundle, edit_json, pixel_bundle, rehash

pytestmark = pytest.mark.usefixtures("flush_denormals")


@pytest.fixture(scope="module")
def bundle(tiny_data, tmp_path_factory) -> Path:
    return pixel_bundle(tiny_data, tmp_path_factory)[0]


@pytest.fixture
def copy(bundle: Path, tmp_path: Path) -> Path:
    return copy_bundle(bundle, tmp_path / "copy")


@pytest.fixture(scope="module")
def image(tiny_data) -> Path:
    return sorted((tiny_data[0] / "images").iterdir())[0]


def _edit_config(copy: Path, **changes: Any) -> None:
    edit_json(copy / "config.json", **changes)
    rehash(copy)


def _refused(copy: Path, *needles: str) -> None:
    """``load_bundle`` (checked or not) and ``Captioner.load`` refuse, naming each of ``needles``."""
    for verify in (True, False):
        with pytest.raises(BundleError) as err:
            load_bundle(copy, verify=verify, graphs="none")
        for needle in needles:
            assert needle in str(err.value), str(err.value)
    with pytest.raises(BundleError):
        Captioner.load(copy, runtime="onnxruntime")


# -- config.json -----------------------------------------------------------------------------------------------------

CONFIG_CASES = [
    ("decode__max_words", 10**9, "decode.max_words"),
    ("decode__max_words", MAX_WORDS + 1, "decode.max_words"),
    ("decode__beam", 10**6, "decode.beam"),
    ("backbone__image_size", 10**6, "backbone.image_size"),
    ("backbone__image_size", MAX_IMAGE_SIZE + 1, "backbone.image_size"),
    ("backbone__image_size", 8, "backbone.image_size"),
    ("backbone__std", [0, 0, 0], "backbone.std"),
    ("backbone__std", [0.2, -0.2, 0.2], "backbone.std"),
    ("backbone__std", [0.2, 0.2], "backbone.std"),
    ("backbone__mean", [0.5, math.inf, 0.5], "backbone.mean"),
    ("backbone__mean", ["0.5", 0.5, 0.5], "backbone.mean"),
    ("backbone__crop_pct", 0, "backbone.crop_pct"),
    ("backbone__crop_mode", "bogus", "crop_mode 'bogus'"),
    ("backbone__interpolation", 3, "interpolation '3'"),
    ("backbone__grid", [2, 10**9], "backbone.grid"),
    ("backbone__feature_dim", 10**9, "backbone.feature_dim"),
    ("model__feature_dim", 10**9, "model.feature_dim"),
    ("model__vocab_size", 10**12, "model.vocab_size"),
    ("vocab__size", 0, "vocab.size"),
]


@pytest.mark.parametrize(("field", "value", "needle"), CONFIG_CASES, ids=[f"{c[0]}={c[1]}" for c in CONFIG_CASES])
def test_finding_config_number_out_of_bounds(copy: Path, field: str, value: Any, needle: str) -> None:
    _edit_config(copy, **{field: value})
    _refused(copy, "config.json", needle)


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("decode__max_words", 10**9, "decode.max_words"),
        ("backbone__image_size", 10**6, "backbone.image_size"),
        ("backbone__std", [0, 0, 0], "backbone.std"),
    ],
)
def test_finding_cli_refuses_the_reported_bundles(copy: Path, image: Path, field: str, value: Any, needle: str):
    """The reported reproductions: they hung, ran out of memory, or printed an empty caption with exit 0."""
    from edgecap.cli import main

    _edit_config(copy, **{field: value})
    result = CliRunner().invoke(main, ["caption", str(image), "--model", str(copy), "--runtime", "onnxruntime"])
    assert result.exit_code == 1 and needle in result.output, result.output


def test_finding_torch_runtime_refuses_an_unbounded_max_words(copy: Path) -> None:
    """The torch runtime hung on it too: it opens the bundle through the same reader."""
    _edit_config(copy, decode__max_words=10**9)
    with pytest.raises(BundleError, match=r"config\.json: decode\.max_words is 1000000000, outside the limit 1\.\.256"):
        Captioner.load(copy, runtime="torch")


@pytest.fixture(scope="module")
def shared_copy(bundle: Path, tmp_path_factory) -> Path:
    return copy_bundle(bundle, tmp_path_factory.mktemp("limits") / "copy")


@given(value=st.integers(min_value=MAX_WORDS + 1, max_value=10**30) | st.integers(max_value=0))
def test_any_max_words_outside_the_limit_is_refused(shared_copy: Path, value: int) -> None:
    config = json.loads((shared_copy / "config.json").read_text())
    config["decode"]["max_words"] = value
    (shared_copy / "config.json").write_text(json.dumps(config))  # checksums unchecked below: no rehash needed
    with pytest.raises(BundleError, match=r"config\.json: decode\.max_words"):
        load_bundle(shared_copy, verify=False, graphs="none")


def test_numbers_within_the_limits_load(copy: Path) -> None:
    _edit_config(copy, decode__max_words=MAX_WORDS, decode__beam=1, backbone__mean=[0, 0, 0], backbone__std=[1, 1, 1])
    opened = load_bundle(copy, graphs="none")
    assert (opened.max_words, opened.beam) == (MAX_WORDS, 1)


# -- manifest.json ---------------------------------------------------------------------------------------------------


def _edit_manifest(copy: Path, edit: Any) -> None:
    manifest = json.loads((copy / MANIFEST_NAME).read_text())
    edit(manifest)
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))


MANIFEST_CASES = {
    "dims-batch-max": (lambda m: m["interface"]["dims"]["batch"].update(max=10**12), "interface.dims['batch'].max"),
    "dims-min-above-max": (lambda m: m["interface"]["dims"]["past"].update(min=50, max=3), "interface.dims['past']"),
    "dims-not-numbers": (lambda m: m["interface"]["dims"].update(regions={"min": "4", "max": 4}), "dims['regions']"),
    "dims-above-limit": (lambda m: m["interface"]["dims"]["images"].update(max=MAX_DIM + 1), "dims['images'].max"),
    "opset": (lambda m: m.update(opset=10**9), "opset"),
    "file-bytes": (lambda m: next(iter(m["files"].values())).update(bytes=1 << 70), ".bytes"),
    "length-levels": (lambda m: m["interface"].update(length={"levels": [[1, 10**9]]}), "length.levels[0][1]"),
    "length-levels-shape": (lambda m: m["interface"].update(length={"levels": [[1, 2, 3]]}), "length.levels[0]"),
    "length-default": (
        lambda m: m["interface"].update(length={"levels": [[1, 9]], "default_level": 7}),
        "length.default_level",
    ),
    "refine-steps": (
        lambda m: m["interface"].update(length={"levels": [[1, 9]], "refine_steps": [10**9]}),
        "length.refine_steps[0]",
    ),
    "eos-decay": (
        lambda m: m["interface"].update(length={"levels": [[1, 9]], "eos_decay": [math.nan]}),
        "length.eos_decay[0]",
    ),
}


@pytest.mark.parametrize("case", sorted(MANIFEST_CASES))
def test_finding_manifest_number_out_of_bounds(copy: Path, case: str) -> None:
    edit, needle = MANIFEST_CASES[case]
    _edit_manifest(copy, edit)
    _refused(copy, MANIFEST_NAME, needle)


# -- numbers JSON can hold but Python will not read ------------------------------------------------------------------


@pytest.mark.parametrize("name", [MANIFEST_NAME, "config.json"])
@pytest.mark.parametrize("text", ["5" * 5000, "[" * 100_000 + "]" * 100_000], ids=["5000-digits", "deep-nesting"])
def test_finding_unreadable_json_names_the_file(copy: Path, name: str, text: str) -> None:
    data = json.loads((copy / name).read_text())
    raw = json.dumps(data).replace('"max_words": 8', f'"max_words": {text}').replace('"opset": 20', f'"opset": {text}')
    assert raw != json.dumps(data)
    (copy / name).write_text(raw)
    if name != MANIFEST_NAME:
        rehash(copy)
    with pytest.raises(BundleError, match=rf"{name}: the bundle (manifest|config) .*(too long|too deeply)"):
        load_bundle(copy, verify=False, graphs="none")


# -- a refine graph's length plan (its metadata, what the mask-predict runtimes read) --------------------------------


def test_finding_refine_graph_metadata_out_of_bounds(tiny_data, tmp_path_factory, tmp_path: Path) -> None:
    """10^9 refinement passes in the refine graph's metadata would never finish: refused when the runtime is built."""
    import onnx

    from edgecap.runtime.backends.base import RuntimeInputError
    from tests.runtime.bundle.helpers import labert_bundle

    copy = copy_bundle(labert_bundle(tiny_data, tmp_path_factory)[0], tmp_path / "labert")
    name = json.loads((copy / MANIFEST_NAME).read_text())["variants"]["fp32"]["files"]["refine"]
    graph = onnx.load(str(copy / name))
    for prop in graph.metadata_props:
        if prop.key == "refine_steps":
            prop.value = json.dumps([10**9] * len(json.loads(prop.value)))
    onnx.save(graph, str(copy / name))
    rehash(copy)
    with pytest.raises(RuntimeInputError, match=r"length plan\.refine_steps\[0\] is 1000000000, outside"):
        Captioner.load(copy, runtime="onnxruntime", precision="fp32")
