"""``--trt-opt-batch`` and ``--trt-workspace-mb`` reach ``Captioner.load`` from ``edgecap caption`` and
``edgecap bench`` (what they do to the TensorRT provider: tests/runtime/backends/test_onnxruntime_fallback.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from edgecap.cli import main


class _Stop(ValueError):
    """Raised by the recording ``Captioner.load``: what it was given is all the test needs."""


def _recording_load(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from edgecap.runtime import captioner

    given: dict[str, Any] = {}

    def load(cls: Any, bundle: Any, **kwargs: Any) -> Any:
        given.update(kwargs)
        raise _Stop("recorded")

    monkeypatch.setattr(captioner.Captioner, "load", classmethod(load))
    return given


def test_caption_passes_the_tensorrt_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import edgecap.runtime.bundle.layout

    given = _recording_load(monkeypatch)
    monkeypatch.setattr(edgecap.runtime.bundle.layout, "find_bundle", lambda model: tmp_path)
    image = tmp_path / "a.png"
    image.write_bytes(b"")
    args = ["caption", str(image), "--model", str(tmp_path), "--trt-opt-batch", "4", "--trt-workspace-mb", "512"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and "recorded" in result.output
    assert given["trt_opt_batch"] == 4 and given["trt_workspace_mb"] == 512
    CliRunner().invoke(main, args[:4])
    assert given["trt_opt_batch"] is None and given["trt_workspace_mb"] is None  # the defaults are the loader's
    refused = CliRunner().invoke(main, [*args[:4], "--trt-opt-batch", "0"])
    assert refused.exit_code == 2 and "--trt-opt-batch" in refused.output


def test_bench_passes_the_opt_batch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from edgecap.bench.run import BenchCfg, BenchCfgError
    from edgecap.bench.subjects import open_subject
    from edgecap.cli.bench import bench_cfg

    flags = {name: () for name in ("bundles", "runtimes", "precisions", "batches", "beams", "length_levels")}
    flags.update(dict.fromkeys(("images", "synthetic", "max_images", "quality_data", "quality_features"), None))
    flags.update(threads=None, spin=None, device=None, providers=None, no_quality=True, quality_images=10)
    flags.update(warmup=0, min_repeats=1, min_seconds=0.0, max_repeats=1, no_isolate=True, tegrastats=False)
    flags.update(step_mode="eager", seed=0, bundles=(str(tmp_path),), trt_opt_batch=4)
    assert bench_cfg(flags).trt_opt_batch == 4
    assert bench_cfg({**flags, "trt_opt_batch": None}).trt_opt_batch is None
    with pytest.raises(BenchCfgError, match="trt_opt_batch"):
        BenchCfg(bundles=(str(tmp_path),), trt_opt_batch=0)
    given = _recording_load(monkeypatch)
    bundle = type("Bundle", (), {"path": tmp_path})()
    with pytest.raises(_Stop):
        open_subject(bundle, "onnxruntime", "fp32", trt_opt_batch=4)
    assert given["trt_opt_batch"] == 4
