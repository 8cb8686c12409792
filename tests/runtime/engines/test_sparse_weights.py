"""2:4 sparse weights: ``BuilderFlag.SPARSE_WEIGHTS`` on every recorded TensorRT surface (strong typing included),
on by default exactly for bundles whose manifest records 2:4 sparsity, ``--sparse-weights`` / ``--no-sparse-weights``
in ``edgecap engine``, and ``trt_sparsity_enable`` for the TensorRT execution provider."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import edgecap.runtime.engines.build as build
import edgecap.runtime.engines.cuda as cuda
from edgecap.cli import main
from edgecap.runtime.backends.onnxruntime.gpu import tensorrt_ep_options
from edgecap.runtime.engines.settings import (
    EngineSettingsError,
    build_settings,
    records_2to4,
    with_sparse_weights,
)
from edgecap.runtime.engines.store import EngineEnv
from tests.runtime.bundle.helpers import copy_bundle, pixel_bundle
from tests.runtime.engines import simulated_device as sim
from tests.runtime.engines.fake_trt import fake_tensorrt


@pytest.mark.parametrize(("surface", "precision", "typing"), [("10.3", "int8", "weak"), ("10.16", "fp16", "auto"),
                                                               ("11.4", "fp32", "auto")])  # fmt: skip
def test_the_flag_exists_and_is_set_on_every_surface(surface: str, precision: str, typing: str) -> None:
    trt = fake_tensorrt(surface)
    settings = with_sparse_weights(trt, build_settings(trt, precision, typing))
    config = trt.Builder(trt.Logger(trt.Logger.WARNING)).create_builder_config()
    settings.apply(trt, config)
    assert config._flags[-1] == "SPARSE_WEIGHTS" and "sparse weights (2:4)" in settings.reason
    assert with_sparse_weights(trt, settings) == settings  # set once


def test_a_tensorrt_without_the_flag_is_refused() -> None:
    trt = fake_tensorrt("11.4")
    settings = build_settings(trt, "fp32")

    class NoSparse:
        __version__ = "11.4.0"
        BuilderFlag = type("BuilderFlag", (), {})

    with pytest.raises(EngineSettingsError, match="SPARSE_WEIGHTS"):
        with_sparse_weights(NoSparse(), settings)


def test_the_manifest_decides_the_default() -> None:
    sparse = {"compression": {"steps": [{"kind": "pruning"}, {"kind": "sparsity", "pattern": "2:4"}]}}
    assert records_2to4(sparse)
    assert not records_2to4({"compression": {"steps": [{"kind": "pruning"}]}})
    assert not records_2to4({})  # bundles from before the compression record
    assert not records_2to4({"compression": {"steps": "junk"}})


def test_tensorrt_ep_sparsity_option(tmp_path: Path) -> None:
    assert tensorrt_ep_options(tmp_path, "fp16", "1.20.0")["trt_sparsity_enable"] is False
    assert tensorrt_ep_options(tmp_path, "fp16", "1.20.0", sparsity=True)["trt_sparsity_enable"] is True


@pytest.fixture
def bundle(tiny_data, tmp_path_factory, tmp_path) -> Path:
    return copy_bundle(pixel_bundle(tiny_data, tmp_path_factory)[0], tmp_path / "bundle")


def _flags(output: str) -> list[str]:
    folder = Path(output.strip().splitlines()[-1].split(": ", 1)[1])
    return json.loads((folder / "engine.json").read_text())["settings"]["builder_flags"]


def test_engine_cli_sets_the_flag_by_request_and_by_manifest(bundle: Path, monkeypatch) -> None:
    monkeypatch.setattr(build, "load_tensorrt", lambda: fake_tensorrt("11.0.0.114"))
    monkeypatch.setattr(build, "current_env", lambda trt, device=0: EngineEnv("11.0.0.114", "NVIDIA H100", "9.0"))
    monkeypatch.setattr(cuda, "set_device", sim.set_device)
    args = ["engine", str(bundle), "--precision", "fp32", "--max-batch", "2", "--beam", "1"]
    dense = CliRunner().invoke(main, args)
    assert dense.exit_code == 0, dense.output
    assert _flags(dense.output) == []  # this bundle records no sparsity: off by default
    sparse = CliRunner().invoke(main, [*args, "--sparse-weights"])
    assert sparse.exit_code == 0, sparse.output
    assert "sparse weights on now" in sparse.output and _flags(sparse.output) == ["SPARSE_WEIGHTS"]
    monkeypatch.setattr(build, "records_2to4", lambda manifest: True)  # a bundle exported from a 2:4 run
    auto = CliRunner().invoke(main, args)
    assert auto.exit_code == 0 and "kept (up to date)" in auto.output
    off = CliRunner().invoke(main, [*args, "--no-sparse-weights"])
    assert off.exit_code == 0 and "sparse weights off now" in off.output and _flags(off.output) == []
