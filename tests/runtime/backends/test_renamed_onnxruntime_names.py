"""The earlier "ort" spellings of ONNX Runtime's names keep working, with a ``FutureWarning``: public functions and
classes (the same objects under their new names), the ``simplify`` value, the preload switch's environment
variable, and what older versions wrote (a thread plan's policy, the TensorRT EP's engine cache folder)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

#: (module, old name, new name) of every public name that was renamed.
RENAMED = [
    ("edgecap.runtime.backends.onnxruntime.session", "OrtRuntime", "OnnxRuntimeSession"),
    ("edgecap.runtime.backends.onnxruntime.session", "OrtProviderError", "OnnxRuntimeProviderError"),
    ("edgecap.runtime.backends.onnxruntime.session", "ORT_TYPES", "ONNXRUNTIME_TYPES"),
    ("edgecap.runtime.backends.onnxruntime.providers", "OrtProviderError", "OnnxRuntimeProviderError"),
    ("edgecap.runtime.backends.onnxruntime.arrays", "ORT_TYPES", "ONNXRUNTIME_TYPES"),
    ("edgecap.runtime.backends.onnxruntime.step", "create_ort_step_model", "create_onnxruntime_step_model"),
    ("edgecap.runtime.backends.onnxruntime.gpu", "ort_version_tuple", "onnxruntime_version_tuple"),
    ("edgecap.runtime.backends.onnxruntime.refine", "create_ort_refine_model", "create_onnxruntime_refine_model"),
    ("edgecap.runtime.backends", "create_ort_refine_model", "create_onnxruntime_refine_model"),
    ("edgecap.runtime.backends.onnxruntime.decoders", "create_ort_decoder", "create_onnxruntime_decoder"),
    ("edgecap.cli.options", "ort_threads_options", "onnxruntime_threads_options"),
]


@pytest.mark.parametrize(("module", "old", "new"), RENAMED)
def test_an_old_name_is_the_new_object_with_a_warning(module: str, old: str, new: str) -> None:
    mod = importlib.import_module(module)
    with pytest.warns(FutureWarning, match=rf"{module}\.{old} is now called {module}\.{new}"):
        value = getattr(mod, old)
    assert value is getattr(mod, new)
    with pytest.warns(FutureWarning):
        imported = {}
        exec(f"from {module} import {old} as found", imported)  # what a user's import does
    assert imported["found"] is value
    assert old not in getattr(mod, "__all__", ()) and old not in vars(mod)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    import edgecap.runtime.backends
    import edgecap.runtime.backends.onnxruntime.session as session

    with pytest.raises(AttributeError, match="OrtNothing"):
        session.OrtNothing  # noqa: B018
    with pytest.raises(AttributeError, match="create_ort_nothing"):
        edgecap.runtime.backends.create_ort_nothing  # noqa: B018


def _tiny_model() -> Any:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    two = helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0])
    nodes = [helper.make_node("Identity", ["x"], ["x1"]), helper.make_node("Mul", ["x1", "two"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [x], [y], initializer=[two])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_simplify_ort_is_the_onnxruntime_simplifier_with_a_warning() -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    from edgecap.workshop.export.onnx import SIMPLIFIERS, simplify_model

    assert "ort" not in SIMPLIFIERS
    new = simplify_model(_tiny_model(), "onnxruntime", "tiny")
    with pytest.warns(FutureWarning, match="simplify 'ort' is now called 'onnxruntime'"):
        old = simplify_model(_tiny_model(), "ort", "tiny")
    assert old.graph == new.graph
    assert [n.op_type for n in new.graph.node] == ["Mul"]  # ONNX Runtime's basic level dropped the Identity


def test_the_preload_switch_reads_its_old_environment_variable_with_a_warning(monkeypatch) -> None:
    import edgecap.runtime.backends.onnxruntime.fallback as fallback

    class Preloading:
        preloads = 0

        def preload_dlls(self) -> None:
            self.preloads += 1

    monkeypatch.setattr(fallback, "_preloaded", False)
    monkeypatch.delenv(fallback.PRELOAD_ENV, raising=False)
    monkeypatch.setenv("EDGECAP_ORT_PRELOAD_DLLS", "0")
    stub = Preloading()
    with pytest.warns(FutureWarning, match="EDGECAP_ORT_PRELOAD_DLLS is now called EDGECAP_ONNXRUNTIME_PRELOAD_DLLS"):
        fallback.preload_gpu_libraries(stub)
    assert stub.preloads == 0
    monkeypatch.setenv(fallback.PRELOAD_ENV, "1")  # the new name wins over the old one
    fallback.preload_gpu_libraries(stub)
    assert stub.preloads == 1


def test_thread_plans_written_with_the_old_policy_name_read_as_today() -> None:
    from edgecap.runtime.backends.threads import ThreadPlan, plan_threads

    plan = plan_threads(0)
    assert plan.policy == "onnxruntime-default"
    assert ThreadPlan.from_dict({**plan.as_dict(), "policy": "ort-default"}) == plan


def test_engines_an_earlier_version_cached_in_the_old_folder_are_used(tmp_path: Path) -> None:
    from edgecap.runtime.backends.onnxruntime.gpu import CACHE_DIRNAME, LEGACY_CACHE_DIRNAMES, tensorrt_cache_dir

    bundle, key = tmp_path / "bundle", f"fp16-{'ab' * 8}"
    bundle.mkdir()
    assert tensorrt_cache_dir(bundle, "fp16", "ab" * 32, tmp_path) == bundle / CACHE_DIRNAME / key
    (bundle / LEGACY_CACHE_DIRNAMES[0] / key).mkdir(parents=True)
    assert LEGACY_CACHE_DIRNAMES == (".ort-trt",)
    assert tensorrt_cache_dir(bundle, "fp16", "ab" * 32, tmp_path) == bundle / ".ort-trt" / key
    assert tensorrt_cache_dir(bundle, "int8", "ab" * 32, tmp_path) == bundle / CACHE_DIRNAME / f"int8-{'ab' * 8}"
    (bundle / CACHE_DIRNAME / key).mkdir(parents=True)  # once both exist, today's folder is the one used
    assert tensorrt_cache_dir(bundle, "fp16", "ab" * 32, tmp_path) == bundle / CACHE_DIRNAME / key


def test_the_runtime_registry_keeps_ort_as_a_warned_alias() -> None:
    from edgecap.runtime.backends import get_runtime, get_runtime_class
    from edgecap.runtime.backends.onnxruntime.session import OnnxRuntimeSession

    with pytest.warns(FutureWarning, match="runtime 'ort' is now called 'onnxruntime'"):
        assert get_runtime("ort").name == "onnxruntime"
    assert get_runtime_class("onnxruntime") is OnnxRuntimeSession
