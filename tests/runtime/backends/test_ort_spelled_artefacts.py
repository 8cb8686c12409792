"""What earlier versions wrote with the "ort" spelling of ONNX Runtime still reads as today's: a thread plan's
policy and the TensorRT EP's engine cache folder (reports naming runtime ``ort``: tests/bench/test_report_schema.py)."""

from __future__ import annotations

from pathlib import Path


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
