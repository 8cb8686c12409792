"""``edgecap export`` of every registered length-controllable (``*-len``) test model with its defaults: pixels in,
FP32 + INT8, the task-level check run at every length level and recorded per level in the manifest; readers take
that record and the one-level record of bundles exported before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgecap.runtime.bundle.manifest import quality_levels
from edgecap.workshop.models import list_models
from tests.runtime.bundle.helpers import pixel_run

LEN_TEST_MODELS = sorted(n for n in list_models() if n.endswith("-len") and "-test" in n)


def test_every_len_test_model_is_registered() -> None:
    assert {"acort-test-len", "image-transformer-test-len"} <= set(LEN_TEST_MODELS)


@pytest.mark.parametrize("model_name", LEN_TEST_MODELS)
def test_export_checks_a_len_model_at_every_level(
    model_name: str, tiny_data, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from edgecap.cli import main
    from edgecap.runtime.bundle import load_bundle

    data, _ = tiny_data
    run, weights = pixel_run(tiny_data, tmp_path_factory, model_name)
    out = tmp_path / "bundle"
    args = ["export", "--model", str(run), "--backbone-weights", str(weights), "--out", str(out)]
    args += ["--int8", "--calib", str(data), "--calib-size", "8", "--quiet"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output

    loaded = load_bundle(out)
    levels = len(json.loads((out / "manifest.json").read_text())["interface"]["length"]["levels"])
    assert levels == 4
    for precision in ("fp32", "int8"):
        quality = loaded.quality(precision)
        assert quality is not None and quality["images"] == 4 and quality["references"] == "human captions"
        assert sorted(quality["levels"]) == ["1", "2", "3", "4"]
        by_level = quality_levels(quality)
        assert sorted(by_level) == [1, 2, 3, 4]
        default = quality["length_level"]
        assert by_level[default]["candidate_cider_d"] == quality["candidate_cider_d"]  # the old shape on top
        for level, check in by_level.items():
            assert check["length_level"] == level and check["set"] == quality["set"]
            assert 0.0 <= check["agreement"] <= 1.0 and check["mean_length_reference"] >= 0
    fp32 = quality_levels(loaded.quality("fp32"))
    assert all(c["agreement"] == 1.0 for c in fp32.values())  # FP32 ONNX Runtime matches torch at every level
    assert loaded.summary()[0]["cider_d"] == loaded.quality("fp32")["candidate_cider_d"]


def test_quality_levels_reads_both_record_shapes() -> None:
    old = {"set": "s", "images": 4, "length_level": 2, "candidate_cider_d": 0.5, "agreement": 1.0}
    assert quality_levels(old) == {2: old}
    assert quality_levels({"set": "s", "candidate_cider_d": 0.1}) == {None: {"set": "s", "candidate_cider_d": 0.1}}
    new = {**old, "levels": {"1": {"candidate_cider_d": 0.25, "agreement": 0.5}, "2": {"candidate_cider_d": 0.5}}}
    read = quality_levels(new)
    assert sorted(read) == [1, 2] and read[1]["agreement"] == 0.5 and read[1]["set"] == "s"
    assert read[1]["length_level"] == 1 and "levels" not in read[1]
    assert quality_levels(None) == {}
