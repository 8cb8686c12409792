"""``build_engines`` around TensorRT: what it asks the builder for (through the fake ``tensorrt`` of a recorded real
version, whose plans are JSON of what was built), where the set is stored, when it is kept, rebuilt or refused, how
TensorRT's failures become one sentence, and that the bundle stays verifiable. Real builds: ``test_trt_gpu.py``."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import edgecap.runtime.engines.build as build
import edgecap.runtime.engines.tensorrt_api as tensorrt_api
from edgecap.runtime.backends.base import TensorMeta
from edgecap.runtime.bundle import load_bundle
from edgecap.runtime.engines.build import EngineBuildError, EngineUnavailableError, build_engines, plan_graphs
from edgecap.runtime.engines.graphs import GraphIO
from edgecap.runtime.engines.profiles import ProfileRequest
from edgecap.runtime.engines.settings import EngineSettingsError
from edgecap.runtime.engines.store import EngineEnv, EngineMismatchError, find_engines, read_record
from tests.runtime.bundle.helpers import copy_bundle, labert_bundle, pixel_bundle
from tests.runtime.engines.fake_trt import TIMING_HEADER, Faults

ORIN = EngineEnv("10.3.0", "Orin", "8.7")


@pytest.fixture
def bundle(tiny_data, tmp_path_factory, tmp_path) -> Path:
    return copy_bundle(pixel_bundle(tiny_data, tmp_path_factory)[0], tmp_path / "bundle")


def _plan(folder: Path, name: str) -> dict:
    return json.loads((folder / name).read_bytes())


def _left_nothing(bundle: Path) -> bool:
    engines = bundle / "engines"
    return not engines.exists() or not [p for p in engines.iterdir() if not p.name.startswith(".")]


def test_builds_every_graph_and_the_gathers_into_the_bundle(bundle: Path, tensorrt_here) -> None:
    result = build_engines(bundle, precision="fp32", max_batch=4, beam=3, workspace_mb=512)
    assert result.built and result.folder.parent == bundle / "engines"
    assert result.folder.name.startswith("fp32-b4-k3-")
    record = read_record(result.folder)
    opened = load_bundle(bundle)  # the engines folder does not break verification
    assert set(record["engines"]) == {"encoder", "step"} and set(record["gathers"]) == {"reorder", "expand"}
    step = _plan(result.folder, "step.plan")
    assert step["source"] == "step.onnx" and step["builder_flags"] == []
    assert step["network_flags"] == 2 and step["strongly_typed"]  # 1 << STRONGLY_TYPED, which is 1 on TensorRT 10
    assert step["workspace"] == 512 << 20
    assert step["profiles"][0]["tokens"] == [[1], [12], [12]]  # 4 images × beam 3
    assert _plan(result.folder, "encoder.plan")["profiles"][0]["pixel_values"][2][0] == 4
    for role in ("encoder", "step"):
        entry = record["engines"][role]
        assert entry["graph_sha256"] == opened.manifest["files"][entry["graph"]]["sha256"]
    reorder, expand = _plan(result.folder, "reorder.plan"), _plan(result.folder, "expand.plan")
    assert [g[0] for g in reorder["gathers"]] == list(opened.updated_state_names)
    assert [g[0] for g in expand["gathers"]] == list(opened.state_names)
    assert all(g[1:] == ["index", 0, f"{g[0]}_gathered"] for g in expand["gathers"])
    assert expand["strongly_typed"] and expand["network_flags"] == 2
    past_max = opened.interface["dims"]["past"]["max"]
    cache = opened.updated_state_names[0]
    shape = record["engines"]["step"]["io"]["inputs"][
        [i["name"] for i in record["engines"]["step"]["io"]["inputs"]].index(cache)
    ]["shape"]
    axis = shape.index("past")
    assert reorder["profiles"][0][cache][2][axis] == past_max + 1  # gathers what the step wrote
    assert (result.folder / "timing.cache").read_bytes() == TIMING_HEADER + b"10.3.0\n++"  # encoder's, then step's
    assert record["env"] == {"trt_version": "10.3.0", "gpu_name": "Orin", "compute_capability": "8.7"}


def test_tensorrt_11_builds_strongly_typed_with_its_own_flag_value(bundle: Path, tensorrt_here) -> None:
    tensorrt_here.use("11.4")
    result = build_engines(bundle, precision="fp32", max_batch=2, beam=2)
    for name in ("encoder.plan", "step.plan", "reorder.plan"):
        plan = _plan(result.folder, name)
        assert plan["network_flags"] == 1 and plan["strongly_typed"] and plan["builder_flags"] == []
    with pytest.raises(EngineSettingsError, match="no weak typing"):
        build_engines(bundle, precision="fp32", max_batch=2, beam=2, typing="weak", rebuild=True)


def test_an_up_to_date_set_is_kept_and_a_modified_one_rebuilt(bundle: Path, tensorrt_here) -> None:
    first = build_engines(bundle, precision="fp32", max_batch=2, beam=2)
    again = build_engines(bundle, precision="fp32", max_batch=2, beam=2)
    assert not again.built and again.folder == first.folder
    (first.folder / "step.plan").write_bytes(b"truncated")
    assert build_engines(bundle, precision="fp32", max_batch=2, beam=2).built
    assert build_engines(bundle, precision="fp32", max_batch=2, beam=2, rebuild=True).built


def test_a_new_tensorrt_or_gpu_gets_its_own_set_and_the_old_one_is_refused(bundle: Path, tensorrt_here) -> None:
    old = build_engines(bundle, precision="fp32", max_batch=2, beam=2)
    opened = load_bundle(bundle)
    shas = {r: opened.manifest["files"][f]["sha256"] for r, f in opened.variant("fp32")["files"].items()}
    h100 = EngineEnv("10.12.0.36", "NVIDIA H100 80GB HBM3", "9.0")
    with pytest.raises(EngineMismatchError, match=r"built with TensorRT 10\.3\.0, this is TensorRT 10\.12") as err:
        find_engines(bundle, "fp32", h100, shas)
    assert "built on Orin (compute capability 8.7)" in str(err.value) and "edgecap engine" in str(err.value)
    tensorrt_here.use("10.16", version_string="10.12.0.36")
    tensorrt_here.gpu = ("NVIDIA H100 80GB HBM3", "9.0")
    new = build_engines(bundle, precision="fp32", max_batch=2, beam=2)
    assert new.built and new.folder != old.folder and old.folder.is_dir()
    assert find_engines(bundle, "fp32", h100, shas)[0] == new.folder
    assert find_engines(bundle, "fp32", ORIN, shas)[0] == old.folder
    stale = {**shas, "step": "0" * 64}  # the bundle re-exported since: no set fits
    with pytest.raises(EngineMismatchError, match="re-exported since"):
        find_engines(bundle, "fp32", ORIN, stale)


def test_labert_builds_encoder_and_refine_without_gathers(tiny_data, tmp_path_factory, tmp_path, tensorrt_here):
    bundle = copy_bundle(labert_bundle(tiny_data, tmp_path_factory)[0], tmp_path / "labert")
    result = build_engines(bundle, precision="fp32", max_batch=3, beam=5)
    record = read_record(result.folder)
    assert set(record["engines"]) == {"encoder", "refine"} and record["gathers"] == {}
    refine = _plan(result.folder, "refine.plan")["profiles"][0]
    assert refine["tokens"][2][0] == 3  # one caption per image: the beam does not multiply refine rows
    assert {"mask_id", "length_levels", "refine_steps", "eos_decay"} <= set(record["metadata"])


def test_refusals(bundle: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(EngineUnavailableError, match="TensorRT is not available") as err:
        build_engines(bundle, precision="fp32")
    assert "edgecap[tensorrt-cu12]" in str(err.value) and "edgecap[tensorrt-cu13]" in str(err.value)
    assert "python3-libnvinfer" in str(err.value)
    with pytest.raises(EngineBuildError, match="has no fp16 graphs"):
        build_engines(bundle, precision="fp16")
    with pytest.raises(EngineBuildError, match="workspace"):
        build_engines(bundle, precision="fp32", workspace_mb=0)
    cpu_int8 = SimpleNamespace(
        path=bundle, precisions=("fp32", "int8"), variant=lambda p: {"preset": "cpu-avx2", "files": {}}
    )
    with pytest.raises(EngineBuildError, match="--int8 --target tensorrt"):
        plan_graphs(cpu_int8, "int8", ProfileRequest())


@pytest.mark.parametrize(
    ("variant", "accepted"),
    [
        ({"preset": "my-trt", "deployment": {"provider": "tensorrt", "runs_on_any_cpu": False}}, True),
        ({"preset": "tensorrt", "deployment": {"provider": "cpu", "runs_on_any_cpu": False}}, False),
        ({"preset": "tensorrt"}, True),  # exported before the deployment record: the built-in preset by name
        ({"preset": "my-trt"}, False),
    ],
)
def test_int8_graphs_are_judged_by_their_recorded_provider(bundle: Path, variant: dict, accepted: bool) -> None:
    opened = SimpleNamespace(
        path=bundle, precisions=("int8",), variant=lambda p: {**variant, "files": {}}, interface={}
    )
    # past the INT8 check, the next refusal is the (here absent) interface dims
    with pytest.raises(EngineBuildError, match="interface.dims" if accepted else "quantised for"):
        plan_graphs(opened, "int8", ProfileRequest())


def test_no_partial_set_is_left_when_a_build_fails(bundle: Path, tensorrt_here, monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise EngineBuildError("TensorRT could not build the step engine")

    monkeypatch.setattr(tensorrt_api, "build_gather", fail)
    with pytest.raises(EngineBuildError):
        build_engines(bundle, precision="fp32", max_batch=2, beam=2)
    assert _left_nothing(bundle)
    load_bundle(bundle)
    shutil.rmtree(bundle / "engines", ignore_errors=True)


# -- TensorRT's failures -----------------------------------------------------------------------------------------------
def test_tensorrt_that_cannot_start_cuda_is_refused_in_one_sentence(bundle: Path, tensorrt_here) -> None:
    tensorrt_here.use("10.3", faults=Faults(cuda=False))  # trt.Builder raises "factory function returned nullptr"
    with pytest.raises(EngineUnavailableError, match=r"TensorRT 10\.3\.0 could not start: CUDA could not be init"):
        build_engines(bundle, precision="fp32", max_batch=2, beam=2)
    assert _left_nothing(bundle)


def test_the_parsers_errors_name_each_rejected_node(bundle: Path, tensorrt_here) -> None:
    tensorrt_here.use("10.3", faults=Faults(unsupported_ops=frozenset({"Conv"})))
    with pytest.raises(EngineBuildError, match=r"ONNX parser rejected onnx/fp32/init\.onnx: In node \d+ ") as err:
        build_engines(bundle, precision="fp32", max_batch=2, beam=2)
    message = str(err.value)
    assert "and operator: Conv" in message and "UNSUPPORTED_NODE: No importer registered for op: Conv" in message
    assert message.count("In node ") == 5 and re.search(r"; and \d+ more$", message)  # five quoted, the rest counted
    assert _left_nothing(bundle)


@pytest.mark.parametrize("cache", [b"\x00damaged", TIMING_HEADER + b"10.16.1.11\n+++"], ids=["damaged", "foreign"])
def test_a_timing_cache_tensorrt_cannot_use_is_replaced(bundle: Path, tensorrt_here, cache: bytes) -> None:
    folder = build_engines(bundle, precision="fp32", max_batch=2, beam=2).folder
    (folder / "timing.cache").write_bytes(cache)  # TensorRT gives no cache for the first, refuses the second
    said: list[str] = []
    again = build_engines(bundle, precision="fp32", max_batch=2, beam=2, rebuild=True, progress=said.append)
    assert again.built and (again.folder / "timing.cache").read_bytes() == TIMING_HEADER + b"10.3.0\n++"
    assert [line for line in said if "ignoring the timing cache: TensorRT cannot use it" in line]


def test_graph_io_without_a_numpy_type_is_refused_before_anything_is_built(
    bundle: Path, tensorrt_here, monkeypatch
) -> None:
    read = build.read_graph_io

    def bf16_cache(path):  # a step graph whose first cache is bfloat16 (TensorRT builds it; numpy cannot hold it)
        io = read(path)
        first = next((s.name for s in io.inputs if s.name.startswith("self_k")), None)

        def retype(s: TensorMeta) -> TensorMeta:
            return TensorMeta(s.name, "bfloat16", s.shape) if s.name == first else s

        return GraphIO(tuple(map(retype, io.inputs)), io.outputs, io.metadata)

    monkeypatch.setattr(build, "read_graph_io", bf16_cache)
    with pytest.raises(
        EngineBuildError, match=r"onnx/fp32/step\.onnx: 'self_k0' \(bfloat16\) cannot be an engine input"
    ):
        build_engines(bundle, precision="fp32", max_batch=2, beam=2)
    assert _left_nothing(bundle)
    states = [TensorMeta("self_k0", "bfloat16", ("batch", 2, "past", 4))]
    with pytest.raises(EngineBuildError, match="gather engines: 'self_k0' \\(bfloat16\\)"):
        tensorrt_api.build_gather(tensorrt_here.trt, states, {}, 64)
