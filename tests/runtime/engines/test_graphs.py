"""A graph's I/O and dynamic-axis names read with onnx, and through ONNX Runtime where onnx is not installed (the
runtime-only install on an edge board): both readings agree."""

from __future__ import annotations

import sys

import pytest

from edgecap.runtime.bundle import load_bundle
from edgecap.runtime.engines.graphs import GraphReaderMissingError, read_graph_io
from tests.runtime.bundle.helpers import pixel_bundle


def test_onnx_and_onnxruntime_readings_agree(tiny_data, tmp_path_factory, monkeypatch) -> None:
    bundle = load_bundle(pixel_bundle(tiny_data, tmp_path_factory)[0])
    path = bundle.graph_path("fp32", "step")
    with_onnx = read_graph_io(path)
    assert with_onnx.input("tokens").shape == ("batch",)
    assert with_onnx.metadata["state_names"].split(",") == list(bundle.state_names)
    monkeypatch.setitem(sys.modules, "onnx", None)
    assert read_graph_io(path) == with_onnx
    with pytest.raises(KeyError, match="no input 'nope'"):
        with_onnx.input("nope")


def test_without_onnx_or_onnxruntime_the_error_names_onnx(monkeypatch, tmp_path) -> None:
    """The hint names onnx and the TensorRT extras, never the CPU onnxruntime (on a GPU machine it would shadow
    onnxruntime-gpu); an ImportError subclass, not a ModuleNotFoundError (which the CLI would call a [train] gap)."""
    for module in ("onnx", "onnxruntime"):
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(GraphReaderMissingError) as missing:
        read_graph_io(tmp_path / "step.onnx")
    message = str(missing.value)
    assert "step.onnx" in message and "pip install onnx" in message and "edgecap[cpu]" not in message
    assert "'edgecap[tensorrt-cu12]' or 'edgecap[tensorrt-cu13]'" in message
    assert isinstance(missing.value, ImportError) and not isinstance(missing.value, ModuleNotFoundError)
