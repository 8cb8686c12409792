"""Precision -> network and builder settings for TensorRT 10.3 (JetPack 6), 10.12, 10.16 and 11.4, decided from the
fake ``tensorrt`` of each recorded version, whose enum values are the real ones (``STRONGLY_TYPED`` is bit 1 on 10.x,
bit 0 on 11.x)."""

from __future__ import annotations

import pytest

from edgecap.runtime.engines.settings import EngineSettingsError, build_settings, trt_version
from tests.runtime.engines.fake_trt import fake_tensorrt

#: The network-flag mask of a strongly typed network: 1 << STRONGLY_TYPED (1 on 10.x, 0 on 11.x).
STRONG_10, STRONG_11 = 1 << 1, 1 << 0


@pytest.mark.parametrize(
    ("surface", "version", "precision", "flags", "builder_flags"),
    [
        ("10.3", None, "fp32", STRONG_10, ()),
        ("10.3", None, "fp16", STRONG_10, ()),  # strongly typed: the ops export keeps in FP32 stay FP32
        ("10.3", None, "int8", 0, ("INT8", "FP16")),  # explicit Q/DQ, weakly typed with flags, no calibrator
        ("10.16", "10.12.0.36", "fp16", STRONG_10, ()),
        ("10.16", "10.12.0.36", "int8", STRONG_10, ()),  # weak typing deprecated from 10.12
        ("10.16", None, "int8", STRONG_10, ()),
        ("11.4", None, "fp16", STRONG_11, ()),
        ("11.4", None, "int8", STRONG_11, ()),
    ],
)
def test_auto_settings_per_version(
    surface: str, version: str | None, precision: str, flags: int, builder_flags: tuple[str, ...]
) -> None:
    trt = fake_tensorrt(surface, version_string=version)
    settings = build_settings(trt, precision)
    assert settings.network_flags == flags and settings.builder_flags == builder_flags
    assert settings.strongly_typed == bool(flags)
    shown = trt.__version__.split(".")
    assert f"{shown[0]}.{shown[1]}" in settings.reason


def test_the_builder_flags_exist_where_they_are_set_and_11_has_none() -> None:
    for surface in ("10.3", "10.16"):
        trt = fake_tensorrt(surface)
        config = trt.Builder(trt.Logger(trt.Logger.WARNING)).create_builder_config()
        build_settings(trt, "int8", "weak").apply(trt, config)
        assert config._flags == ["INT8", "FP16"]
    assert not hasattr(fake_tensorrt("11.4").BuilderFlag, "FP16")


def test_a_tensorrt_without_the_creation_flag_builds_strong_only_where_typing_is_fixed() -> None:
    eleven = fake_tensorrt("11.4")
    delattr(eleven.NetworkDefinitionCreationFlag, "STRONGLY_TYPED")  # a future 11.x that drops the ignored flag
    settings = build_settings(eleven, "int8")
    assert settings.strongly_typed and settings.network_flags == 0 and settings.builder_flags == ()
    ten = fake_tensorrt("10.3")
    delattr(ten.NetworkDefinitionCreationFlag, "STRONGLY_TYPED")
    with pytest.raises(EngineSettingsError, match="STRONGLY_TYPED"):
        build_settings(ten, "fp16", "strong")


def test_typing_overrides() -> None:
    assert build_settings(fake_tensorrt("10.3"), "int8", "strong").network_flags == STRONG_10
    weak = build_settings(fake_tensorrt("10.16", version_string="10.12.0"), "fp16", "weak")
    assert not weak.strongly_typed and weak.builder_flags == ("FP16",) and weak.network_flags == 0
    with pytest.raises(EngineSettingsError, match="no weak typing"):
        build_settings(fake_tensorrt("11.4"), "fp16", "weak")


def test_refusals() -> None:
    with pytest.raises(EngineSettingsError, match="older than 10.3"):
        build_settings(fake_tensorrt("10.3", version_string="8.6.1"), "fp16")
    with pytest.raises(EngineSettingsError, match="precision"):
        build_settings(fake_tensorrt("10.3"), "bf16")
    with pytest.raises(EngineSettingsError, match="typing"):
        build_settings(fake_tensorrt("10.3"), "fp16", "loose")
    with pytest.raises(EngineSettingsError, match="version"):
        trt_version(fake_tensorrt("10.3", version_string="unknown"))
