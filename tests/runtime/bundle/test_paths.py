"""One path rule for every file a bundle names: relative, inside the bundle once symlinks are resolved, listed in
the manifest and verified before it is opened. Each case mutates a real exported bundle (the pixel bundle: FP32, a
carried backbone weights file) so that only the path rule can catch it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgecap import Captioner
from edgecap.runtime.bundle import BundleError, load_bundle
from edgecap.runtime.bundle.manifest import MANIFEST_NAME
from edgecap.workshop.runs import load_bundle_model
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


def _outside(copy: Path, name: str) -> Path:
    """A byte-identical copy of the bundle's ``name`` beside the bundle (so checksums alone cannot catch it)."""
    target = copy.parent / "outside" / Path(name).name
    target.parent.mkdir(exist_ok=True)
    shutil.copy(copy / name, target)
    return target


def _edit_manifest(copy: Path, precision: str, field: str, role: str, value: str) -> None:
    manifest = json.loads((copy / MANIFEST_NAME).read_text())
    manifest["variants"][precision][field][role] = value
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2))


def _step_name(copy: Path) -> str:
    return json.loads((copy / MANIFEST_NAME).read_text())["variants"]["fp32"]["files"]["step"]


@pytest.mark.parametrize("field", ["files", "graphs"])
@pytest.mark.parametrize("where", ["parent", "absolute", "hidden"])
def test_a_variant_graph_outside_the_bundle_or_unlisted_is_refused(copy: Path, field: str, where: str):
    step = _step_name(copy)
    outside = _outside(copy, step)
    if where == "parent":
        value = os.path.relpath(outside, copy)
    elif where == "absolute":
        value = str(outside)
    else:  # inside, but hidden: never listed, never flagged as unlisted, never hashed
        value = ".step.onnx"
        shutil.copy(copy / step, copy / value)
    _edit_manifest(copy, "fp32", field, "step", value)
    with pytest.raises(BundleError, match=rf"\$\.variants\.fp32\.{field}\.step: "):
        load_bundle(copy)
    with pytest.raises(BundleError):
        Captioner.load(copy, runtime="onnxruntime")


def test_caption_refuses_a_step_graph_from_outside_the_bundle(copy: Path, image: Path):
    """A manifest naming ``../outside/step.onnx`` as its FP32 step graph once captioned with exit 0; now refused."""
    from edgecap.cli import main

    outside = _outside(copy, _step_name(copy))
    _edit_manifest(copy, "fp32", "files", "step", os.path.relpath(outside, copy))
    result = CliRunner().invoke(main, ["caption", str(image), "--model", str(copy), "--runtime", "onnxruntime"])
    assert result.exit_code == 1 and "not a relative path inside the bundle" in result.output, result.output


@pytest.mark.parametrize("field", ["vocab__file", "weights", "backbone_weights"])
@pytest.mark.parametrize("where", ["parent", "absolute", "hidden"])
def test_a_config_file_field_outside_the_bundle_or_unlisted_is_refused(copy: Path, field: str, where: str):
    config = json.loads((copy / "config.json").read_text())
    name = config["vocab"]["file"] if field == "vocab__file" else config[field]
    outside = _outside(copy, name)
    if where == "parent":
        value = os.path.relpath(outside, copy)
    elif where == "absolute":
        value = str(outside)
    else:
        value = f".{Path(name).name}"
        shutil.copy(copy / name, copy / value)
    edit_json(copy / "config.json", **{field: value})
    rehash(copy)  # config.json's checksum is right again: only the path rule can catch it
    for verify in (True, False):
        with pytest.raises(BundleError, match=field.replace("__", ".")):
            load_bundle(copy, verify=verify)
    with pytest.raises(BundleError):
        Captioner.load(copy, runtime="onnxruntime")
    with pytest.raises(BundleError):
        Captioner.load(copy, runtime="onnxruntime", verify=False)


@pytest.mark.parametrize("field", ["config.json", "vocab.json", "weights", "backbone_weights", "step"])
def test_a_symlink_inside_the_bundle_pointing_outside_is_refused(copy: Path, field: str):
    config = json.loads((copy / "config.json").read_text())
    name = {"weights": config["weights"], "backbone_weights": config["backbone_weights"], "step": _step_name(copy)}
    name = name.get(field, field)
    outside = _outside(copy, name)  # the same bytes: the checksum matches
    (copy / name).unlink()
    (copy / name).symlink_to(outside)
    for verify in (True, False):
        with pytest.raises(BundleError, match="outside"):
            bundle = load_bundle(copy, verify=verify, graphs="none")
            load_bundle_model(bundle)
            bundle.graph_path("fp32", "step")


def test_a_symlink_staying_inside_the_bundle_is_accepted(copy: Path):
    (copy / "vocab.json").rename(copy / "vocab-real.json")
    (copy / "vocab.json").symlink_to("vocab-real.json")
    edit_json(copy / "config.json", vocab__file="vocab-real.json")
    rehash(copy)
    assert load_bundle(copy).load_vocab().size > 0


def test_used_files_cover_every_file_a_runtime_opens(bundle: Path):
    opened = load_bundle(bundle)
    config = opened.config
    assert set(opened.used_files("fp32", weights=True)) == {
        "config.json",
        config["vocab"]["file"],
        config["weights"],
        config["backbone_weights"],
        *opened.variant("fp32")["files"].values(),
    }


def test_a_run_directory_naming_a_file_outside_it_is_refused(tiny_data, tmp_path_factory, tmp_path):
    from edgecap.workshop.runs import load_run
    from edgecap.workshop.training.checkpoint import RunError
    from tests.runtime.bundle.helpers import pixel_run

    run, _ = pixel_run(tiny_data, tmp_path_factory)
    copy = Path(shutil.copytree(run, tmp_path / "run"))
    outside = tmp_path / "outside.safetensors"
    shutil.copy(copy / "weights.safetensors", outside)
    with pytest.raises(RunError, match="not a relative path inside the run directory"):
        load_run(copy, weights="../outside.safetensors")
    (copy / "vocab.json").rename(tmp_path / "vocab.json")
    (copy / "vocab.json").symlink_to(tmp_path / "vocab.json")
    with pytest.raises(RunError, match="outside the run directory"):
        load_run(copy)


def test_a_manifest_symlinked_outside_the_bundle_is_refused(copy: Path, image: Path):
    """``manifest.json`` is opened under the same rule as every other file: a symlink leaving the bundle is refused
    (it loaded and captioned, although vocabulary and graph symlinks were refused)."""
    from edgecap.cli import main

    outside = _outside(copy, MANIFEST_NAME)
    (copy / MANIFEST_NAME).unlink()
    (copy / MANIFEST_NAME).symlink_to(outside)
    for verify in (True, False):
        with pytest.raises(BundleError, match=r"'manifest.json' resolves to .*outside the bundle"):
            load_bundle(copy, verify=verify, graphs="none")
    with pytest.raises(BundleError, match="manifest.json"):
        Captioner.load(copy, runtime="onnxruntime")
    result = CliRunner().invoke(main, ["caption", str(image), "--model", str(copy), "--runtime", "onnxruntime"])
    assert result.exit_code == 1 and "outside the bundle" in result.output, result.output


def test_a_manifest_symlink_staying_inside_the_bundle_is_accepted(copy: Path):
    (copy / MANIFEST_NAME).rename(copy / ".manifest-real.json")
    (copy / MANIFEST_NAME).symlink_to(".manifest-real.json")
    assert load_bundle(copy, graphs="none").name


def test_the_tensorrt_ep_cache_symlinked_outside_the_bundle_is_refused(tmp_path: Path):
    """ONNX Runtime's TensorRT EP deserialises the engines it finds in the bundle's ``.onnxruntime-trt`` cache: a
    symlink leading elsewhere would feed it engines from outside the bundle."""
    from edgecap.runtime.backends.onnxruntime.gpu import CACHE_DIRNAME, tensorrt_cache_dir

    bundle, home, elsewhere = tmp_path / "bundle", tmp_path / "home", tmp_path / "elsewhere"
    bundle.mkdir()
    elsewhere.mkdir()
    assert tensorrt_cache_dir(bundle, "fp16", "ab" * 32, home) == bundle / CACHE_DIRNAME / f"fp16-{'ab' * 8}"
    (bundle / CACHE_DIRNAME).symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(
        BundleError, match=r"engine cache: '\.onnxruntime-trt/fp16-abababababababab' resolves to .*outside"
    ):
        tensorrt_cache_dir(bundle, "fp16", "ab" * 32, home)
