"""A runtime registered in a test is usable from ``Captioner.load`` and ``edgecap bench`` with no other edit: the
registry is the only list of runtimes those read."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from edgecap import Captioner
from edgecap.bench.report import load_report
from edgecap.cli import main
from edgecap.runtime.backends import registry as registry_module
from edgecap.runtime.backends.registry import LoadedRuntime, RuntimeSpec, register_runtime

CALLS: list[str] = []


def load_toy(bundle: Any, request: Any) -> LoadedRuntime:
    """The toy runtime: the bundle's FP32 graphs on ONNX Runtime's CPU provider, one thread, tagged as the toy's."""
    from edgecap.runtime.backends.onnxruntime.loader import load_bundle_runtime

    CALLS.append(request.precision)
    loaded = load_bundle_runtime(bundle, dataclasses.replace(request, providers=["cpu"], threads=1))
    loaded.info["provider_reason"] = "the toy runtime pins the CPU provider"
    return loaded


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> RuntimeSpec:
    registry_module.load_runtime_plugins()  # into the real registry, before the private copy
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))
    monkeypatch.setattr(registry_module, "_ALIASES", dict(registry_module._ALIASES))
    CALLS.clear()
    return register_runtime(
        RuntimeSpec(
            name="toy",
            description="a test runtime: ONNX Runtime pinned to one CPU thread",
            loader=f"{__name__}:load_toy",
            requires=("onnxruntime",),
            precisions=("fp32",),
        )
    )


def test_captioner_load_finds_a_registered_runtime(toy: RuntimeSpec, tiny_bundle: Path) -> None:
    features = {
        "features": np.random.default_rng(0).standard_normal((2, 5, 24)).astype(np.float32),
        "boxes": np.tile(np.array([0.1, 0.1, 0.6, 0.6], np.float32), (2, 5, 1)),
        "feature_mask": np.ones((2, 5), dtype=bool),
    }
    with Captioner.load(tiny_bundle, runtime="toy", precision="fp32", beam=2) as cap:
        info = cap.runtime_info
        assert info["runtime"] == "toy" and info["providers"] == ["CPUExecutionProvider"]
        assert "toy runtime" in info["provider_reason"] and "toy" in info["summary"]
        captions = cap.caption_inputs(features)
    with Captioner.load(tiny_bundle, runtime="onnxruntime", precision="fp32", beam=2) as reference:
        assert captions == reference.caption_inputs(features)  # the same graphs, the same captions
    assert CALLS == ["fp32"]
    with pytest.raises(ValueError, match=r"runtime 'toy' runs \['fp32'\], not 'int8'"):
        Captioner.load(tiny_bundle, runtime="toy", precision="int8")


def test_edgecap_bench_measures_a_registered_runtime(toy: RuntimeSpec, tiny_bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    args = ["bench", "--bundle", str(tiny_bundle), "--runtime", "toy", "--batch", "1", "--beam", "1"]
    args += ["--synthetic", "2", "--no-isolate", "--no-quality", "--quiet", "--out", str(out)]
    args += ["--warmup", "1", "--min-repeats", "2", "--min-seconds", "0"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = load_report(out / "report.json")
    assert [(r.runtime, r.precision) for r in report.results] == [("toy", "fp32")] and not report.errors
    assert report.results[0].providers == ["CPUExecutionProvider"] and CALLS == ["fp32"]


def test_the_caption_cli_accepts_a_registered_runtime_and_the_old_onnxruntime_name(
    toy: RuntimeSpec, tiny_bundle: Path
) -> None:
    """``--runtime`` is checked against the registry when the command runs, not against a list frozen at import."""
    runner = CliRunner()
    refused = runner.invoke(main, ["caption", "x.jpg", "--model", str(tiny_bundle), "--runtime", "nope"])
    assert refused.exit_code == 2 and "not a registered runtime" in refused.output and "toy" in refused.output
    with pytest.warns(FutureWarning, match="'ort' is now called 'onnxruntime'"):
        old = runner.invoke(main, ["caption", "x.jpg", "--model", str(tiny_bundle), "--runtime", "ort"])
    assert "not a registered runtime" not in old.output  # accepted; it then fails on the missing image, not the name
