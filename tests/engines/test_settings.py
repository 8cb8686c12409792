"""Precision -> network and builder settings for TensorRT 10.3 (JetPack 6), 10.12 and 11.0, decided from a stand-in
``tensorrt`` module exposing only what the logic reads (no TensorRT here)."""

from __future__ import annotations

import pytest

from edgecap.engines.settings import EngineSettingsError, build_settings, trt_version
from tests.engines.conftest import fake_trt

STRONG = 1 << 0  # the stand-in's STRONGLY_TYPED member is 0


@pytest.mark.parametrize(
    ("version", "precision", "strong", "flags"),
    [
        ("10.3.0.30", "fp32", True, ()),
        ("10.3.0.30", "fp16", True, ()),  # strongly typed: the ops export keeps in FP32 stay FP32
        ("10.3.0.30", "int8", False, ("INT8", "FP16")),  # explicit Q/DQ, weakly typed with flags, no calibrator
        ("10.12.0.36", "fp16", True, ()),
        ("10.12.0.36", "int8", True, ()),  # weak typing deprecated from 10.12
        ("11.0.0.114", "fp16", True, ()),
        ("11.0.0.114", "int8", True, ()),
    ],
)
def test_auto_settings_per_version(version: str, precision: str, strong: bool, flags: tuple[str, ...]) -> None:
    trt = fake_trt(version, weak_flags=not version.startswith("11"))
    settings = build_settings(trt, precision)
    assert (settings.strongly_typed, settings.builder_flags) == (strong, flags)
    assert settings.network_flags == (STRONG if strong else 0)
    assert version.split(".")[0] + "." + version.split(".")[1] in settings.reason


def test_tensorrt_11_without_the_creation_flag_is_strong_with_no_flags() -> None:
    settings = build_settings(fake_trt("11.2.0", strongly_typed=False, weak_flags=False), "int8")
    assert settings.strongly_typed and settings.network_flags == 0 and settings.builder_flags == ()


def test_typing_overrides() -> None:
    assert build_settings(fake_trt("10.3.0"), "int8", "strong").strongly_typed
    weak = build_settings(fake_trt("10.12.0"), "fp16", "weak")
    assert not weak.strongly_typed and weak.builder_flags == ("FP16",)
    with pytest.raises(EngineSettingsError, match="no weak typing"):
        build_settings(fake_trt("11.0.0", weak_flags=False), "fp16", "weak")
    with pytest.raises(EngineSettingsError, match="STRONGLY_TYPED"):
        build_settings(fake_trt("10.3.0", strongly_typed=False), "fp16", "strong")


def test_refusals() -> None:
    with pytest.raises(EngineSettingsError, match="older than 10.3"):
        build_settings(fake_trt("8.6.1"), "fp16")
    with pytest.raises(EngineSettingsError, match="precision"):
        build_settings(fake_trt("10.3.0"), "bf16")
    with pytest.raises(EngineSettingsError, match="typing"):
        build_settings(fake_trt("10.3.0"), "fp16", "loose")
    with pytest.raises(EngineSettingsError, match="version"):
        trt_version(fake_trt("unknown"))


def test_apply_sets_the_builder_flags() -> None:
    trt = fake_trt("10.3.0")
    calls = []

    class Config:
        def set_flag(self, flag: str) -> None:
            calls.append(flag)

    build_settings(trt, "int8").apply(trt, Config())
    build_settings(trt, "fp16").apply(trt, Config())
    assert calls == ["INT8", "FP16"]
