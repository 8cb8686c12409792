"""The manifest schema, checksums and reports, on hand-made directories (no export needed)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from edgecap._version import __version__
from edgecap.runtime.bundle.manifest import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    PRECISION_ORDER,
    SCHEMA_PATH,
    BundleError,
    BundleIntegrityError,
    BundleVersionError,
    hash_files,
    is_newer_version,
    jsonable,
    parse_manifest,
    software_versions,
    summary_rows,
    verify_files,
)


def _files(root: Path) -> Path:
    (root / "onnx" / "fp32").mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "onnx" / "fp32" / "init.onnx").write_bytes(b"\x08\x07graph-bytes" * 10)
    (root / "onnx" / "fp32" / "step.onnx").write_bytes(b"step-bytes" * 10)
    return root


def _manifest(root: Path, **changes) -> dict:
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "versions": software_versions(),
        "model": {"name": "ort-test"},
        "opset": 20,
        "interface": {"decode_inputs": ["features"], "state_names": ["s"], "runtime_graphs": {"encoder": "init"}},
        "variants": {"fp32": {"files": {"encoder": "onnx/fp32/init.onnx", "step": "onnx/fp32/step.onnx"}}},
        "files": hash_files(root),
    }
    manifest.update(changes)
    return manifest


def test_hash_files_covers_every_file_but_the_manifest_and_hidden_ones(tmp_path: Path):
    root = _files(tmp_path)
    (root / MANIFEST_NAME).write_text("{}")
    (root / ".DS_Store").write_text("finder")
    files = hash_files(root)
    assert sorted(files) == ["config.json", "onnx/fp32/init.onnx", "onnx/fp32/step.onnx"]
    assert files["config.json"] == {
        "sha256": "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
        "bytes": 2,
    }


def test_a_valid_manifest_parses_and_verifies(tmp_path: Path):
    root = _files(tmp_path)
    manifest = parse_manifest(_manifest(root), "m.json")
    verify_files(root, manifest)


def test_newer_format_version_is_refused_with_both_versions_named(tmp_path: Path):
    data = _manifest(_files(tmp_path), format_version=FORMAT_VERSION + 1)
    data["versions"]["edgecap"] = "9.0.0"
    with pytest.raises(BundleVersionError) as err:
        parse_manifest(data, "bundle/manifest.json")
    message = str(err.value)
    assert f"format version {FORMAT_VERSION + 1}" in message and f"up to {FORMAT_VERSION}" in message
    assert "9.0.0" in message and __version__ in message and "bundle/manifest.json" in message


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"format": "something-else"}, "$.format: is 'something-else', expected 'edgecap-bundle'"),
        ({"format_version": "1"}, "$.format_version: expected integer, got string '1'"),
        ({"format_version": 0}, "$.format_version: 0 is below the minimum 1"),
        ({"opset": None}, "$.opset: expected integer, got null"),
        ({"model": {}}, "$.model: field 'name' is missing"),
        ({"variants": {}}, "$.variants: field 'fp32' is missing"),
        ({"variants": {"fp8": {"files": {}}, "fp32": {"files": {}}}}, "$.variants: unknown field 'fp8'"),
        (
            {"variants": {"fp32": {"files": {"encoder": "onnx/fp32/other.onnx"}}}},
            "$.variants.fp32.files.encoder: graph file 'onnx/fp32/other.onnx' is not listed in 'files'",
        ),
        ({"variants": {"fp32": {"files": {"step": "onnx/fp32/step.onnx"}}}}, "runtime role(s) ['encoder']"),
        (
            {"interface": {"decode_inputs": ["features"], "state_names": [[], "s"], "runtime_graphs": {}}},
            "$.interface.state_names[0]: expected string, got array",
        ),
        (
            {"interface": {"decode_inputs": [1], "state_names": ["s"], "runtime_graphs": {"encoder": "init"}}},
            "$.interface.decode_inputs[0]: expected string, got integer",
        ),
        (
            {"interface": {"decode_inputs": [], "state_names": [], "runtime_graphs": {}, "tokens": ["t"]}},
            "$.interface.tokens: expected string, got array",
        ),
        (
            {"interface": {"decode_inputs": [], "state_names": [], "runtime_graphs": {"encoder": 3}}},
            "$.interface.runtime_graphs.encoder: expected string, got integer",
        ),
        (
            {"interface": {"decode_inputs": [], "state_names": [], "runtime_graphs": {}, "decoding": "diffusion"}},
            "$.interface.decoding: 'diffusion' is unknown to this edgecap",
        ),
        (
            {"interface": {"decode_inputs": [], "state_names": [], "runtime_graphs": {"refine": "r"}}},
            "runtime role(s) ['refine'] have no meaning for autoregressive decoding",
        ),
        (
            {"variants": {"fp32": {"files": {"encoder": "onnx/fp32/init.onnx"}, "schemes": {"step": "dynamic"}}}},
            "$.variants.fp32.schemes.step: expected object, got string",
        ),
    ],
)
def test_malformed_manifests_name_the_file_and_the_json_path(tmp_path: Path, change: dict, needle: str):
    with pytest.raises(BundleError) as err:
        parse_manifest(_manifest(_files(tmp_path), **change), "m.json")
    assert str(err.value).startswith("m.json: ") and needle in str(err.value)


def test_a_corrupt_file_entry_is_named_by_its_path(tmp_path: Path):
    data = _manifest(_files(tmp_path))
    data["files"]["onnx/fp32/step.onnx"]["sha256"] = "ABC"
    with pytest.raises(BundleError, match=r"\$\.files\['onnx/fp32/step\.onnx'\]\.sha256: 'ABC' does not match"):
        parse_manifest(data, "m.json")
    data = _manifest(_files(tmp_path / "b"))
    data["files"]["config.json"]["bytes"] = -1
    with pytest.raises(BundleError, match=r"\$\.files\['config\.json'\]\.bytes: -1 is below the minimum 0"):
        parse_manifest(data, "m.json")


def test_older_manifests_without_the_later_fields_still_parse(tmp_path: Path):
    """Bundles written before ``decoding``, ``updated_state_names`` (or with it null) and ``graphs``/``schemes``."""
    data = _manifest(_files(tmp_path))
    data["interface"] = {**data["interface"], "updated_state_names": None}
    data["versions"] = {"edgecap": "0.1.0", "torch": None}
    assert parse_manifest(data, "m.json")["interface"].get("decoding") is None


def test_the_schema_lists_the_precisions_a_bundle_can_hold():
    schema = json.loads(SCHEMA_PATH.read_text())
    assert list(schema["properties"]["variants"]["properties"]) == list(PRECISION_ORDER)
    assert schema["properties"]["format"]["const"] == FORMAT


@pytest.mark.parametrize("name", ["../outside.onnx", "/etc/passwd", ""])
def test_paths_outside_the_bundle_are_refused(tmp_path: Path, name: str):
    data = _manifest(_files(tmp_path))
    data["files"][name] = {"sha256": "0" * 64, "bytes": 1}
    with pytest.raises(BundleError, match="not a relative path inside the bundle"):
        parse_manifest(data, "m.json")


def test_a_flipped_byte_is_caught_and_the_file_named(tmp_path: Path):
    root = _files(tmp_path)
    manifest = _manifest(root)
    path = root / "onnx" / "fp32" / "step.onnx"
    data = bytearray(path.read_bytes())
    data[5] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(BundleIntegrityError) as err:
        verify_files(root, manifest)
    assert "onnx/fp32/step.onnx" in str(err.value) and "SHA-256" in str(err.value)


def test_missing_truncated_and_unlisted_files_are_all_reported(tmp_path: Path):
    root = _files(tmp_path)
    manifest = _manifest(root)
    (root / "config.json").unlink()
    (root / "onnx" / "fp32" / "init.onnx").write_bytes(b"short")
    (root / "onnx" / "fp32" / "sneaky.onnx").write_bytes(b"x")
    (root / "._resource_fork").write_bytes(b"ignored")
    with pytest.raises(BundleIntegrityError) as err:
        verify_files(root, manifest)
    message = str(err.value)
    assert "config.json: missing" in message
    assert "onnx/fp32/init.onnx: 5 bytes" in message
    assert "onnx/fp32/sneaky.onnx: not listed" in message
    assert "_resource_fork" not in message


def test_jsonable_makes_strict_json():
    value = {"a": (1, np.float32(0.5)), "b": math.nan, "c": np.int64(3), "d": [math.inf, Path("x")]}
    out = jsonable(value)
    assert out == {"a": [1, 0.5], "b": None, "c": 3, "d": [None, "x"]}
    json.dumps(out, allow_nan=False)


def test_summary_rows_report_the_worst_output_relative_to_its_tolerance():
    parity = {
        "encoder": {"passed": True, "outputs": {"memory": {"max_abs": 5e-4, "atol": 1e-3}}},  # 0.5 of its bound
        "step": {"passed": True, "outputs": {"logprobs": {"max_abs": 9e-5, "atol": 1e-4}}},  # 0.9: the worst
    }
    manifest = {
        "files": {"a.onnx": {"bytes": 100}, "b.onnx": {"bytes": 50}, "c.onnx": {"bytes": 10}},
        "variants": {
            "int8": {"files": {"encoder": "c.onnx"}, "quality": {"agreement": 0.9, "candidate_cider_d": 1.0}},
            "fp32": {"files": {"encoder": "a.onnx", "step": "b.onnx"}, "parity": parity},
        },
    }
    rows = summary_rows(manifest)
    assert [r["precision"] for r in rows] == ["fp32", "int8"]
    assert rows[0]["bytes"] == 150 and rows[0]["parity_max_abs"] == 9e-5 and rows[0]["parity_atol"] == 1e-4
    assert rows[0]["parity_passed"] is True and rows[0]["agreement"] is None
    assert rows[1]["parity_passed"] is None and rows[1]["agreement"] == 0.9 and rows[1]["cider_d"] == 1.0


@pytest.mark.parametrize(
    "variant",
    [
        {"parity": {"step": {"passed": True, "outputs": {"logprobs": {"max_abs": "9e-5", "atol": 1e-4}}}}},
        {"parity": {"step": {"passed": True, "outputs": {"logprobs": {"max_abs": 1e-5, "atol": [1]}}}}},
        {"parity": {"step": {"passed": True, "outputs": ["logprobs"]}}},
        {"parity": {"step": "passed"}},
        {"parity": ["step"]},
        {"quality": {"agreement": "all", "images": [4], "set": {"a": 1}, "cider_d_delta": 1e999}},
        {"quality": "good"},
    ],
)
def test_summary_rows_show_a_hand_edited_report_field_as_unknown(variant: dict):
    """A manifest's reports are not parsed for loading, so ``edgecap info`` and benchmark reports read whatever
    they hold: a malformed field is shown as unknown (None), never a TypeError."""
    (row,) = summary_rows({"files": {}, "variants": {"fp32": {"files": {}, **variant}}})
    assert row["parity_max_abs"] is None or row["parity_max_abs"] == 1e-5
    assert all(row[k] is None for k in ("agreement", "images", "quality_set", "cider_d_delta"))


def test_software_versions_and_version_order():
    versions = software_versions()
    assert versions["edgecap"] == __version__ and versions["torch"] and versions["onnxruntime"]
    assert is_newer_version("0.10.0", "0.9.3") and not is_newer_version("0.1.0rc1", "0.1.0")
