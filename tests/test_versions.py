"""Every version check reads versions through ``packaging`` (``edgecap.runtime._versions``): nightlies (``.devN``),
local
builds (``+cpu``, ``+cu12``), TensorRT's four-part versions and pre-releases order as :pep:`440` says, and a vendor
string that is not :pep:`440` still reads by its leading release numbers."""

from __future__ import annotations

import types
from typing import Any

import pytest

from edgecap.runtime._versions import InvalidVersion, Version, parse_version, release
from edgecap.runtime.backends.onnxruntime import providers as onnxruntime_providers
from edgecap.runtime.backends.onnxruntime.gpu import onnxruntime_version_tuple
from edgecap.runtime.bundle.manifest import is_newer_version
from edgecap.runtime.engines.settings import EngineSettingsError, trt_version
from edgecap.workshop.export.calibration.onnxruntime_utils import release_numbers


@pytest.mark.parametrize(
    ("text", "parts", "expected"),
    [
        ("1.20.0.dev2024", 2, (1, 20)),
        ("2.14.1+cpu", 3, (2, 14, 1)),
        ("10.3.0.30", 3, (10, 3, 0)),
        ("10.3rc1", 3, (10, 3, 0)),
        ("10.3.dev1", 3, (10, 3, 0)),
        ("v1.19.2", 2, (1, 19)),
        ("1.18.0-jetson", 2, (1, 18)),  # not PEP 440: its leading release numbers
        ("1", 3, (1, 0, 0)),
    ],
)
def test_release_reads_dev_local_and_vendor_versions(text: str, parts: int, expected: tuple[int, ...]) -> None:
    assert release(text, parts) == expected


def test_parse_version_is_pep_440_and_refuses_what_is_no_version() -> None:
    assert parse_version("1.20.0.dev2024") < parse_version("1.20.0") < parse_version("1.20.0.post1")
    assert parse_version("2.14.1+cpu") == Version("2.14.1+cpu") > Version("2.14.1")
    for text in ("latest", "", "unknown"):
        with pytest.raises(InvalidVersion):
            parse_version(text)
    assert issubclass(InvalidVersion, ValueError)


def test_onnxruntime_version_tuple() -> None:
    assert onnxruntime_version_tuple("1.20.0.dev20240101") == (1, 20)
    assert onnxruntime_version_tuple("1.18.1+cu118") == (1, 18)
    assert onnxruntime_version_tuple("v1.22.0") == (1, 22)
    assert onnxruntime_version_tuple("1.9rc1") == (1, 9)
    with pytest.raises(ValueError, match="not an onnxruntime version"):
        onnxruntime_version_tuple("latest")


def _trt(version: str) -> Any:
    return types.SimpleNamespace(__version__=version)


def test_trt_version() -> None:
    assert trt_version(_trt("10.3.0.30")) == (10, 3, 0)
    assert trt_version(_trt("10.13.3.9+cuda13")) == (10, 13, 3)
    assert trt_version(_trt("10.14")) == (10, 14, 0)
    assert trt_version(_trt("10.3.dev1")) == (10, 3, 0)  # a development build of 10.3, not 10.3.1
    assert trt_version(_trt("11.0rc1")) == (11, 0, 0)
    for text in ("unknown", "10", ""):
        with pytest.raises(EngineSettingsError, match="cannot read the TensorRT version"):
            trt_version(_trt(text))


def test_is_newer_version_in_pep_440_order() -> None:
    assert is_newer_version("0.10.0", "0.9.3")
    assert is_newer_version("0.2.0", "0.2.0rc1") and not is_newer_version("0.2.0rc1", "0.2.0")
    assert is_newer_version("0.2.0.post1", "0.2.0") and is_newer_version("0.3.0.dev1", "0.2.0")
    assert not is_newer_version("0.2.0+local", "0.2.0+local")
    assert not is_newer_version("not a version", "0.1.0") and not is_newer_version("0.1.0", "")


def test_quantize_release() -> None:
    assert release_numbers("1.33.0.dev20250101") == (1, 33, 0)
    assert release_numbers("1.32.0+cpu") == (1, 32, 0)
    assert release_numbers("v1.32.0") == (1, 32, 0)
    assert release_numbers("latest") == ()


@pytest.mark.parametrize(
    ("installed", "too_old"),
    [("1.22.0.dev20250101", False), ("1.22.0+cu12", False), ("1.21.1", True), ("latest", True)],
)
def test_scheme_minimum_reads_dev_and_local_onnxruntime(
    installed: str, too_old: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_onnxruntime = types.SimpleNamespace(__version__=installed)
    monkeypatch.setattr(onnxruntime_providers, "import_onnxruntime", lambda: fake_onnxruntime)
    variant = {"schemes": {"step": {"scheme": "weight-only", "bits": 8}}}
    reason = onnxruntime_providers._onnxruntime_too_old_for(variant)
    assert bool(reason) is too_old
    if too_old:
        assert f"installed: {installed}" in reason and "onnxruntime >= 1.22" in reason
