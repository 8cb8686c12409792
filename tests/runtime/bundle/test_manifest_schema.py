"""``manifest.schema.json`` on real bundles: the runtime's validator judges a manifest and its mutations as
``jsonschema`` does, and manifests of older bundles (before ``decoding``, ``updated_state_names``, with TensorRT
calibration tables) still pass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edgecap.runtime.bundle.manifest import MANIFEST_NAME, SCHEMA_PATH, parse_manifest
from edgecap.runtime.schema import errors, load_schema
from tests.runtime.bundle.helpers import region_bundle
from tests.runtime.schema_check import disagreements, mutations


def _manifest(tiny_data: tuple[Path, Path], factory: pytest.TempPathFactory) -> dict[str, Any]:
    return json.loads((region_bundle(tiny_data, factory) / MANIFEST_NAME).read_text())


def _older(manifest: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` as a bundle of an earlier edgecap wrote it."""
    old = json.loads(json.dumps(manifest))
    for key in ("decoding", "updated_state_names", "length", "dims"):
        old["interface"].pop(key, None)
    old.pop("held_out", None)
    old["variants"]["fp32"].pop("graphs", None)
    old["variants"]["fp32"]["artefacts"] = {"tensorrt_caches": {"init": "calibration/init.trt_calibration.cache"}}
    return old


def test_a_real_manifest_and_an_older_one_parse(tiny_data, tmp_path_factory) -> None:
    manifest = _manifest(tiny_data, tmp_path_factory)
    assert {"fp32", "fp16", "int8"} <= set(manifest["variants"])  # every precision's record is exercised
    parse_manifest(manifest, "manifest.json")
    parse_manifest(_older(manifest), "manifest.json")


def test_it_judges_manifests_as_jsonschema_does(tiny_data, tmp_path_factory) -> None:
    """A real FP32 + FP16 + INT8 manifest, its older form, and 1,500 mutations of it."""
    manifest = _manifest(tiny_data, tmp_path_factory)
    schema = load_schema(str(SCHEMA_PATH))
    docs = [manifest, _older(manifest), *mutations(manifest, limit=1500)]
    found = disagreements(docs, schema)
    assert found == [], found[:3]
    rejected = sum(1 for doc in docs if next(errors(doc, schema, schema), None) is not None)
    assert rejected > 100  # the mutations do break it (most land in the unconstrained export records)
