"""The Triton model repository: layout, config.pbtxt, checks before any write, nothing left behind on failure."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest

from edgecap.runtime.serving.protocol import INPUTS, OUTPUTS, TensorSpec
from edgecap.runtime.serving.repository import (
    MODEL_PY,
    ModelConfig,
    ServingOptions,
    config_pbtxt,
    model_name_for,
    write_triton_repository,
)


def test_the_repository_is_tritons_layout_with_the_bundle_inside(served_bundle: Path, tmp_path: Path) -> None:
    dest = tmp_path / "models"
    models = write_triton_repository([served_bundle], dest, ServingOptions(max_batch=16, instances=2))
    name = served_bundle.name
    assert models == {name: dest / name}
    assert (dest / name / "1" / "model.py").read_text() == MODEL_PY
    assert (dest / name / "1" / "bundle" / "manifest.json").is_file()
    assert not (dest / name / "1" / "bundle").is_symlink()
    config = (dest / name / "config.pbtxt").read_text()
    assert f'name: "{name}"' in config and 'backend: "python"' in config and "max_batch_size: 16" in config
    assert "count: 2 kind: KIND_CPU" in config and "dynamic_batching" in config
    assert [p.name for p in tmp_path.iterdir()] == ["models"]  # the staging directory is gone


def test_link_points_at_the_bundle(served_bundle: Path, tmp_path: Path) -> None:
    write_triton_repository([served_bundle], tmp_path / "m", ServingOptions(), link=True)
    link = tmp_path / "m" / served_bundle.name / "1" / "bundle"
    assert link.is_symlink() and link.resolve() == served_bundle.resolve()


def test_config_names_every_tensor_and_the_queue_policy() -> None:
    config = config_pbtxt("m", ServingOptions(max_queue_delay_us=500, max_queue_size=7, threads=3, precision="int8"))
    for tensor in (*INPUTS, *OUTPUTS):
        dims = ", ".join(str(d) for d in tensor.shape)
        assert f'name: "{tensor.name}" data_type: {tensor.dtype} dims: [ {dims} ]' in config
    assert "max_queue_delay_microseconds: 500" in config and "max_queue_size: 7" in config
    assert 'key: "edgecap_threads" value: { string_value: "3" }' in config
    assert 'key: "edgecap_precision" value: { string_value: "int8" }' in config
    assert config.count("allow_ragged_batch: true") == len(INPUTS)


def test_config_record_quotes_its_parameters_and_refuses_a_bad_tensor() -> None:
    record = ModelConfig.for_bundle("m", ServingOptions())
    assert record.inputs == INPUTS and record.outputs == OUTPUTS
    assert record.to_pbtxt() == config_pbtxt("m", ServingOptions())
    quoted = dataclasses.replace(record, parameters=(("edgecap_runtime", 'a"b'),)).to_pbtxt()
    assert 'string_value: "a\\"b"' in quoted
    with pytest.raises(ValueError, match="Triton config type"):
        TensorSpec("x", "INT32", (1,))
    with pytest.raises(ValueError, match="dims must be positive or -1"):
        TensorSpec("x", "TYPE_INT32", (0,))


def test_an_existing_destination_is_refused_before_any_work(served_bundle: Path, tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    with pytest.raises(FileExistsError, match="already exists"):
        write_triton_repository([served_bundle], tmp_path / "models", ServingOptions())


def test_a_repository_inside_a_bundle_is_refused_before_any_write(served_bundle: Path, tmp_path: Path) -> None:
    bundle = tmp_path / served_bundle.name
    shutil.copytree(served_bundle, bundle)
    before = sorted(p.relative_to(bundle) for p in bundle.rglob("*"))
    linked = tmp_path / "linked"
    linked.symlink_to(bundle, target_is_directory=True)
    for dest in (bundle / "repo", bundle / "deeper" / "repo", linked / "repo"):
        with pytest.raises(ValueError, match=f"is inside the bundle {bundle}"):
            write_triton_repository([bundle], dest, ServingOptions())
    assert sorted(p.relative_to(bundle) for p in bundle.rglob("*")) == before  # not even a staging folder


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_parent_is_refused(served_bundle: Path, tmp_path: Path) -> None:
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        with pytest.raises(PermissionError):
            write_triton_repository([served_bundle], parent / "models", ServingOptions())
    finally:
        parent.chmod(0o700)


def test_a_broken_bundle_fails_before_anything_is_written(served_bundle: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(served_bundle, broken)
    (broken / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError):
        write_triton_repository([served_bundle, broken], tmp_path / "models", ServingOptions())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken"]


def test_two_bundles_with_one_name_are_refused(served_bundle: Path, tmp_path: Path) -> None:
    twin = tmp_path / "other" / served_bundle.name
    shutil.copytree(served_bundle, twin)
    with pytest.raises(ValueError, match="both be model"):
        write_triton_repository([served_bundle, twin], tmp_path / "models", ServingOptions())


@pytest.mark.parametrize("name", ["has space", "ü-model", "x" * 129, ".hidden"])
def test_model_names_triton_cannot_serve_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="Triton model name"):
        model_name_for(tmp_path / name)


@pytest.mark.parametrize(
    "field,value",
    [
        ("max_batch", 0),
        ("instances", 0),
        ("max_queue_size", -1),
        ("max_batch", True),
        ("instances", 1.5),
        ("max_pixels", 0),
    ],
)
def test_absurd_options_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        ServingOptions(**{field: value})  # type: ignore[arg-type]


def test_the_request_bounds_reach_the_model_through_the_config() -> None:
    from types import SimpleNamespace

    from edgecap.runtime.serving.triton_model import served_captioner

    config = config_pbtxt("m", ServingOptions(max_pixels=1234, max_batch_bytes=5678))
    assert 'key: "edgecap_max_pixels" value: { string_value: "1234" }' in config
    assert 'key: "edgecap_max_batch_bytes" value: { string_value: "5678" }' in config
    captioner = SimpleNamespace(decode_cfg=SimpleNamespace(strategy="greedy"))
    params = {"edgecap_max_pixels": {"string_value": "1234"}, "edgecap_max_batch_bytes": {"string_value": "5678"}}
    served = served_captioner({"parameters": params}, captioner)
    assert (served.max_pixels, served.max_batch_bytes) == (1234, 5678)
    with pytest.raises(ValueError, match="edgecap_max_pixels must be a positive integer"):
        served_captioner({"parameters": {"edgecap_max_pixels": {"string_value": "-1"}}}, captioner)
