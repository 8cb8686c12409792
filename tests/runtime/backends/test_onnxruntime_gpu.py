"""TensorRT execution provider options, built on CPU: caches, precision flags, version gates and profiles."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgecap.runtime.backends.onnxruntime.gpu import (
    CACHE_DIRNAME,
    DEFAULT_TRT_OPT_BATCH,
    DEFAULT_TRT_WORKSPACE_MB,
    onnxruntime_version_tuple,
    tensorrt_cache_dir,
    tensorrt_ep_options,
    trt_opt_sizes,
    trt_profile_shapes,
)

DIMS = {"batch": {"min": 1, "max": 96}, "past": {"min": 0, "max": 60}, "regions": {"min": 49, "max": 49}}
#: A manifest's dims at the exporter's default limit, with image states (``images``).
BIG = {
    "batch": {"min": 1, "max": 1024},
    "images": {"min": 1, "max": 1024},
    "past": {"min": 0, "max": 19},
    "regions": {"min": 1, "max": 100},
}
STEP_INPUTS = {"tokens": ["batch"], "self_k": ["batch", 2, 8, "past", 32], "memory_bias": ["batch", 1, 1, "regions"]}


def test_versions_parse_to_major_minor() -> None:
    assert onnxruntime_version_tuple("1.18.1") == (1, 18)
    assert onnxruntime_version_tuple("1.20.0.dev20240101") == (1, 20)
    assert onnxruntime_version_tuple("1.9rc1") == (1, 9)
    with pytest.raises(ValueError, match="not an onnxruntime version"):
        onnxruntime_version_tuple("latest")


def test_profiles_cover_rows_and_cache_length_from_the_bundle_dims() -> None:
    shapes = trt_profile_shapes(STEP_INPUTS, DIMS, opt={"batch": 24})
    assert shapes["trt_profile_min_shapes"] == "tokens:1,self_k:1x2x8x0x32,memory_bias:1x1x1x49"
    assert shapes["trt_profile_opt_shapes"] == "tokens:24,self_k:24x2x8x60x32,memory_bias:24x1x1x49"
    assert shapes["trt_profile_max_shapes"] == "tokens:96,self_k:96x2x8x60x32,memory_bias:96x1x1x49"


@pytest.mark.parametrize(
    ("inputs", "opt", "match"),
    [
        ({"x": ["batch", None]}, None, "axis 1: dimension None"),
        ({"x": ["rows"]}, None, "'rows' has no bounds"),
        ({"x": ["batch"]}, {"batch": 200}, "outside"),
    ],
)
def test_profiles_refuse_unbounded_dimensions(inputs, opt, match) -> None:
    with pytest.raises(ValueError, match=match):
        trt_profile_shapes(inputs, DIMS, opt)


def test_opt_is_a_typical_call_and_max_the_manifests_limit() -> None:
    """The encoder runs once per image, the step once per hypothesis (images × beam) with its image states once per
    image; opt is the bench's default batch, max stays the bundle's 1024 rows."""
    assert trt_opt_sizes(BIG, "encoder", DEFAULT_TRT_OPT_BATCH) == {"batch": 8, "images": 8, "past": 9}
    assert trt_opt_sizes(BIG, "step", 8, beam=3) == {"batch": 24, "images": 8, "past": 9}
    assert trt_opt_sizes(BIG, "refine", 4, beam=3)["batch"] == 4  # mask-predict: one row per image
    step = {"tokens": ["batch"], "self_k": ["batch", 2, "past", 4], "memory": ["images", "regions", 4]}
    shapes = trt_profile_shapes(step, BIG, trt_opt_sizes(BIG, "step", 8, beam=3))
    assert shapes["trt_profile_opt_shapes"] == "tokens:24,self_k:24x2x9x4,memory:8x100x4"
    assert shapes["trt_profile_max_shapes"] == "tokens:1024,self_k:1024x2x19x4,memory:1024x100x4"
    assert shapes["trt_profile_min_shapes"] == "tokens:1,self_k:1x2x0x4,memory:1x1x4"


def test_opt_sizes_stay_within_the_bundles_bounds() -> None:
    small = {"batch": {"min": 2, "max": 16}, "images": {"min": 1, "max": 16}}
    assert trt_opt_sizes(small, "step", 8, beam=5) == {"batch": 16, "images": 8}  # 40 rows: capped at the maximum
    assert trt_opt_sizes(small, "encoder", 1) == {"batch": 2, "images": 1}  # raised to the minimum
    with pytest.raises(ValueError, match=">= 1"):
        trt_opt_sizes(small, "step", 0)
    with pytest.raises(ValueError, match=">= 1"):
        trt_opt_sizes(small, "step", 4, beam=0)


def test_the_workspace_is_bounded_unless_told_otherwise() -> None:
    assert DEFAULT_TRT_WORKSPACE_MB == 1024
    assert tensorrt_ep_options("/c", "fp16", "1.20.0")["trt_max_workspace_size"] == 1024 << 20
    assert tensorrt_ep_options("/c", "fp16", "1.20.0", workspace_mb=256)["trt_max_workspace_size"] == 256 << 20
    assert "trt_max_workspace_size" not in tensorrt_ep_options("/c", "fp16", "1.20.0", workspace_mb=None)


def test_the_bench_default_batch_is_what_the_profiles_are_tuned_for() -> None:
    from edgecap.bench.run import BenchCfg

    assert max(BenchCfg.__dataclass_fields__["batches"].default) == DEFAULT_TRT_OPT_BATCH


def test_precision_flags_and_caches() -> None:
    fp16 = tensorrt_ep_options("/c", "fp16", "1.18.0")
    assert fp16["trt_fp16_enable"] is True and fp16["trt_int8_enable"] is False
    assert fp16["trt_engine_cache_enable"] is True and fp16["trt_engine_cache_path"] == "/c"
    assert fp16["trt_timing_cache_enable"] is True and fp16["trt_timing_cache_path"] == "/c"
    int8 = tensorrt_ep_options("/c", "int8", "1.18.0", workspace_mb=512, device_id=1)
    assert int8["trt_int8_enable"] is True and int8["trt_fp16_enable"] is False
    assert int8["trt_max_workspace_size"] == 512 * 1024 * 1024 and int8["device_id"] == 1
    assert "trt_int8_calibration_table_name" not in int8  # QDQ graphs carry their scales
    fp32 = tensorrt_ep_options("/c", "fp32", "1.18.0", timing_cache=False)
    assert not fp32["trt_fp16_enable"] and "trt_timing_cache_path" not in fp32
    with pytest.raises(ValueError, match="precision"):
        tensorrt_ep_options("/c", "bf16", "1.18.0")
    with pytest.raises(ValueError, match="workspace"):
        tensorrt_ep_options("/c", "fp16", "1.18.0", workspace_mb=0)


def test_options_newer_than_the_installed_onnxruntime_are_left_out() -> None:
    profiles = trt_profile_shapes(STEP_INPUTS, DIMS)
    new = tensorrt_ep_options("/c", "fp16", "1.18.0", profiles=profiles)
    assert all(new[k] == v for k, v in profiles.items())
    old = tensorrt_ep_options("/c", "fp16", "1.14.1", profiles=profiles)
    assert not any(k.startswith("trt_profile_") for k in old) and "trt_timing_cache_path" not in old
    mid = tensorrt_ep_options("/c", "fp16", "1.15.0", profiles=profiles)
    assert "trt_profile_max_shapes" in mid and "trt_timing_cache_path" not in mid


def test_cache_lives_in_the_bundle_unless_it_is_read_only(tmp_path: Path, monkeypatch) -> None:
    bundle, home = tmp_path / "my-bundle", tmp_path / "home"
    bundle.mkdir()
    inside = tensorrt_cache_dir(bundle, "fp16", "ab" * 32, home)
    assert inside == bundle / CACHE_DIRNAME / f"fp16-{'ab' * 8}"
    assert CACHE_DIRNAME.startswith(".")  # hidden: outside the manifest, the bundle stays verifiable
    monkeypatch.setattr("edgecap.runtime.backends.onnxruntime.gpu.os.access", lambda path, mode: False)
    assert tensorrt_cache_dir(bundle, "int8", "cd" * 32, home) == home / "trt-engines" / f"my-bundle-int8-{'cd' * 8}"


def test_onnxruntime_session_reads_its_own_inputs_for_the_profiles(tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    onnxruntime = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    from edgecap.runtime.backends.onnxruntime.session import OnnxRuntimeSession

    x = helper.make_tensor_value_info("self_k", TensorProto.FLOAT, ["batch", 2, "past"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2, "past"])
    graph = helper.make_graph([helper.make_node("Identity", ["self_k"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "g.onnx"
    onnx.save(model, path)
    runtime = OnnxRuntimeSession(path, providers=["cpu"], trt_profile_dims=DIMS)
    shapes = runtime._trt_profiles(onnxruntime, {})
    assert shapes["trt_profile_max_shapes"] == "self_k:96x2x60"
    assert shapes["trt_profile_opt_shapes"] == "self_k:8x2x30"  # a typical call, not the 96-row maximum
    runtime.trt_opt_batch, runtime.trt_beam = 4, 3
    assert (
        runtime._trt_profiles(onnxruntime, {})["trt_profile_opt_shapes"] == "self_k:4x2x30"
    )  # no role: once per image
    step = OnnxRuntimeSession(path, providers=["cpu"], trt_profile_dims=DIMS, role="step", trt_opt_batch=4, trt_beam=3)
    assert step._trt_profiles(onnxruntime, {})["trt_profile_opt_shapes"] == "self_k:12x2x30"  # a hypothesis per row
    assert runtime._trt_profiles(onnxruntime, {"trt_profile_min_shapes": "self_k:1x2x0"}) == {}  # explicit ones win
    with runtime:  # a CPU session is unaffected by the TensorRT-only option
        assert runtime.providers_in_use() == ["CPUExecutionProvider"]


class _FakeOrtValue:
    """The OrtValue accessors of releases without DLPack (``data_ptr``, ``shape``, ``data_type``, ``numpy``)."""

    def __init__(self, array) -> None:
        self.array = array

    def data_ptr(self) -> int:
        return int(self.array.data_ptr()) if hasattr(self.array, "data_ptr") else self.array.ctypes.data

    def shape(self) -> list[int]:
        return list(self.array.shape)

    def data_type(self) -> str:
        return {"float32": "tensor(float)", "float16": "tensor(float16)", "int64": "tensor(int64)"}[
            str(self.array.dtype).removeprefix("torch.")
        ]

    def numpy(self):
        return self.array


def test_cuda_array_interface_describes_a_device_buffer() -> None:
    import numpy as np

    from edgecap.runtime.backends.onnxruntime.session import cuda_array_interface

    assert cuda_array_interface(4096, (2, 3), np.float16) == {
        "shape": (2, 3),
        "typestr": "<f2",
        "data": (4096, False),
        "version": 2,
    }
    assert cuda_array_interface(8, [4], np.bool_)["typestr"] == "|b1"


def test_outputs_without_dlpack_on_the_cpu_come_through_numpy() -> None:
    import numpy as np
    import torch

    from edgecap.workshop.torch_runtime.onnxruntime_binding import to_torch as _to_torch

    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = _to_torch(_FakeOrtValue(array), torch.device("cpu"))
    assert out.dtype == torch.float32 and out.tolist() == array.tolist()
