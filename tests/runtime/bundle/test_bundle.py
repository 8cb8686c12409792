"""Loading a bundle verifies it: corrupt, incomplete, inconsistent or too-new bundles are refused by name; writing
one is atomic."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from edgecap.runtime.bundle import (
    FORMAT_VERSION,
    BundleConfigError,
    BundleError,
    BundleIntegrityError,
    BundleNotFoundError,
    BundleVersionError,
    is_bundle,
    load_bundle,
)
from edgecap.workshop.export.writer import create_bundle
from tests.runtime.bundle.helpers import copy_bundle, edit_json, region_bundle, rehash


@pytest.fixture(scope="module")
def bundle(tiny_data, tmp_path_factory) -> Path:
    return region_bundle(tiny_data, tmp_path_factory)


@pytest.fixture
def copy(bundle: Path, tmp_path: Path) -> Path:
    return copy_bundle(bundle, tmp_path / "copy")


def test_a_fresh_bundle_loads_with_everything_it_promises(bundle: Path):
    loaded = load_bundle(bundle)
    assert is_bundle(bundle) and loaded.name == "ort-test"
    assert loaded.precisions == ("fp32", "fp16", "int8")
    assert loaded.decode_inputs == ("features", "boxes", "feature_mask")
    assert loaded.state_names and not loaded.backbone_in_graph and loaded.backbone_spec == {}
    for precision in loaded.precisions:
        assert loaded.graph_path(precision, "encoder").is_file() and loaded.graph_path(precision, "step").is_file()
    assert loaded.load_vocab().size == loaded.config["model"]["vocab_size"]
    assert loaded.max_words == 12 and loaded.beam == 3
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.relative_to(bundle).as_posix(): p.stat().st_mode & 0o777 for p in bundle.rglob("*") if p.is_file()}
    assert set(modes.values()) == {0o666 & ~umask}, modes  # shareable, even what safetensors writes 0600


def test_a_flipped_byte_in_a_graph_is_refused_naming_the_file(copy: Path):
    path = copy / "onnx" / "fp32" / "step.onnx"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(BundleIntegrityError) as err:
        load_bundle(copy)
    assert "onnx/fp32/step.onnx" in str(err.value) and "corrupt" in str(err.value)


def test_a_missing_file_is_refused(copy: Path):
    (copy / "vocab.json").unlink()
    with pytest.raises(BundleIntegrityError, match=r"vocab\.json: missing"):
        load_bundle(copy)


def test_an_unlisted_file_is_refused(copy: Path):
    shutil.copy(copy / "onnx" / "fp32" / "step.onnx", copy / "onnx" / "fp32" / "step-v2.onnx")
    with pytest.raises(BundleIntegrityError, match=r"step-v2\.onnx: not listed"):
        load_bundle(copy)


def test_a_vocab_that_does_not_match_the_config_is_refused(copy: Path):
    size = json.loads((copy / "config.json").read_text())["vocab"]["size"]
    edit_json(copy / "config.json", vocab__size=size + 1, model__vocab_size=size + 1)
    rehash(copy)  # only the consistency check can catch it now
    with pytest.raises(BundleConfigError) as err:
        load_bundle(copy)
    assert "vocab.json does not match config.json" in str(err.value) and "classes" in str(err.value)


def test_a_vocab_of_another_kind_is_refused(copy: Path):
    edit_json(copy / "config.json", vocab__kind="radix")
    rehash(copy)
    with pytest.raises(BundleConfigError, match="kind 'word' vs 'radix'"):
        load_bundle(copy)


def test_a_newer_manifest_version_is_refused(copy: Path):
    edit_json(copy / "manifest.json", format_version=FORMAT_VERSION + 1)
    with pytest.raises(BundleVersionError, match="newer than this edgecap"):
        load_bundle(copy)


def test_graphs_that_do_not_match_the_interface_are_refused(copy: Path):
    # the start graph in place of the step graph: checksums recomputed, so only the interface check can tell
    shutil.copy(copy / "onnx" / "fp16" / "start.onnx", copy / "onnx" / "fp16" / "step.onnx")
    rehash(copy)
    load_bundle(copy, graphs=["fp32"])  # the intact variant is fine on its own
    with pytest.raises(BundleConfigError) as err:
        load_bundle(copy)
    message = str(err.value)
    assert "onnx/fp16/step.onnx" in message and "missing input(s) ['tokens'" in message


def test_a_directory_without_manifest_is_not_a_bundle(tmp_path: Path):
    with pytest.raises(BundleNotFoundError, match="edgecap export"):
        load_bundle(tmp_path)
    with pytest.raises(BundleNotFoundError, match="not a directory"):
        load_bundle(tmp_path / "nothing")


def test_asking_for_a_variant_it_lacks_names_what_it_holds(bundle: Path):
    loaded = load_bundle(bundle, verify=False, graphs="none")
    loaded.manifest["variants"].pop("fp16")
    with pytest.raises(BundleError, match=r"no 'fp16' variant \(it holds \['fp32', 'int8'\]\).*--fp16"):
        loaded.variant("fp16")


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_an_interrupted_write_leaves_nothing(tmp_path: Path):
    with pytest.raises(KeyboardInterrupt), create_bundle(tmp_path / "b") as builder:
        builder.write_json("config.json", {"model": {}})
        builder.write_bytes("onnx/fp32/init.onnx", b"graph")
        raise KeyboardInterrupt
    assert not (tmp_path / "b").exists() and _leftovers(tmp_path) == []


def test_a_bundle_that_was_never_finalised_is_not_moved_into_place(tmp_path: Path):
    with pytest.raises(BundleError, match="not finalised"), create_bundle(tmp_path / "b") as builder:
        builder.write_json("config.json", {})
    assert not (tmp_path / "b").exists() and _leftovers(tmp_path) == []


def test_an_existing_bundle_is_kept_unless_overwrite(bundle: Path, tmp_path: Path):
    target = copy_bundle(bundle, tmp_path / "b")
    with pytest.raises(FileExistsError), create_bundle(target):
        pass
    with pytest.raises(RuntimeError), create_bundle(target, overwrite=True) as builder:
        builder.write_json("config.json", {})
        raise RuntimeError("export failed")
    load_bundle(target)  # the old bundle is untouched
    assert _leftovers(tmp_path) == []
