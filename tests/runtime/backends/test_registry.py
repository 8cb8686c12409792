"""The one runtime registry: lazy, names missing backends and what to install, drives ``runtime="auto"``."""

from __future__ import annotations

import pytest

from edgecap.runtime.backends import (
    Runtime,
    RuntimeSpec,
    UnknownRuntimeError,
    auto_runtime,
    canonical_runtime,
    get_runtime,
    get_runtime_class,
    list_runtimes,
    load_runtime,
    register_runtime,
    runtime_available,
)
from edgecap.runtime.backends import registry as registry_module


class EchoRuntime(Runtime):
    """A graph that returns its feed (enough to construct through the registry)."""

    def _activate(self) -> None: ...

    def _input_metadata(self):  # noqa: ANN202
        return {}

    def _infer(self, feed):  # noqa: ANN001, ANN202
        return dict(feed)

    def _close(self) -> None: ...


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> dict[str, RuntimeSpec]:
    """A private copy of the registry (the plugins loaded first, into the real one), restored after the test."""
    registry_module.load_runtime_plugins()
    copy = dict(registry_module._REGISTRY)
    monkeypatch.setattr(registry_module, "_REGISTRY", copy)
    monkeypatch.setattr(registry_module, "_ALIASES", dict(registry_module._ALIASES))
    return copy


def test_builtin_runtimes_are_registered_in_auto_order() -> None:
    names = list_runtimes()
    assert names[:2] == ["onnxruntime", "torch"] and "torch-rerun" in names
    assert "torch-rerun" not in list_runtimes(baselines=False)
    assert get_runtime("onnxruntime").precisions == ("fp32", "fp16", "int8")
    assert get_runtime("torch-rerun").baseline and get_runtime("torch-rerun").auto_rank is None


def test_unknown_names_and_bad_targets_are_refused(registry: dict[str, RuntimeSpec]) -> None:
    with pytest.raises(UnknownRuntimeError, match="registered"):
        get_runtime("nope")
    with pytest.raises(ValueError, match="package.module:attr"):
        RuntimeSpec(name="bad", description="", loader="no_colon")
    with pytest.raises(TypeError, match="RuntimeSpec"):
        register_runtime("bad")  # type: ignore[arg-type]


def test_a_runtime_whose_backend_is_missing_says_what_to_install(registry: dict[str, RuntimeSpec]) -> None:
    spec = register_runtime(
        RuntimeSpec(
            name="ghost",
            description="needs a package that is not installed",
            loader="edgecap.runtime.backends.onnxruntime.loader:load_bundle_runtime",
            requires=("edgecap_no_such_backend",),
            install="pip install edgecap-ghost",
            auto_rank=-1,
        )
    )
    ok, why = runtime_available("ghost")
    assert not ok and "edgecap_no_such_backend" in why and "pip install edgecap-ghost" in why
    assert "ghost" not in list_runtimes(available=True)
    with pytest.raises(UnknownRuntimeError, match="pip install edgecap-ghost"):
        spec.load_function()
    chosen, reason = auto_runtime()  # ranked first but missing: the next installed one wins, and the reason says so
    assert chosen.name != "ghost" and "edgecap_no_such_backend" in reason


def test_graph_runtime_classes_are_imported_on_demand(registry: dict[str, RuntimeSpec]) -> None:
    register_runtime(
        RuntimeSpec(
            name="echo", description="", loader=f"{__name__}:EchoRuntime", graph_runtime=f"{__name__}:EchoRuntime"
        )
    )
    runtime = load_runtime("echo")
    assert isinstance(runtime, EchoRuntime) and not runtime.is_active
    register_runtime(
        RuntimeSpec(
            name="missing",
            description="",
            loader="edgecap.runtime.backends.does_not_exist:f",
            graph_runtime="edgecap.runtime.backends.does_not_exist:X",
        )  # fmt: skip
    )
    with pytest.raises(UnknownRuntimeError, match="not part of this installation"):
        get_runtime_class("missing")


def test_no_runtime_installed_is_a_clear_error(registry: dict[str, RuntimeSpec]) -> None:
    registry.clear()
    register_runtime(
        RuntimeSpec(
            name="x",
            description="",
            loader="a.b:c",
            requires=("edgecap_no_such_backend",),
            install="pip install 'edgecap[cpu]'",
            auto_rank=0,
        )  # fmt: skip
    )
    with pytest.raises(UnknownRuntimeError, match=r"edgecap\[cpu\]"):
        auto_runtime()


def test_the_old_onnxruntime_name_still_works_with_a_warning(registry: dict[str, RuntimeSpec]) -> None:
    """``ort`` was the ONNX Runtime runtime's name before the Object Relation Transformer family made it ambiguous."""
    with pytest.warns(FutureWarning, match="'ort' is now called 'onnxruntime'"):
        assert get_runtime("ort") is get_runtime("onnxruntime")
    assert canonical_runtime("ort") == "onnxruntime" and canonical_runtime("tensorflow") == "tensorflow"
    assert "ort" not in list_runtimes()
    with pytest.raises(ValueError, match="already belong"):
        register_runtime(RuntimeSpec(name="other", description="", loader="m:f", aliases=("torch",)))
    with pytest.raises(ValueError, match="already belong"):
        register_runtime(RuntimeSpec(name="ort", description="", loader="m:f"))
