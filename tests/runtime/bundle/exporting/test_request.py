"""``ExportRequest``: the export's options, validated before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgecap.workshop.export.bundling import BundleExportError
from edgecap.workshop.export.bundling.request import ExportRequest


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"target": "nope"}, "unknown INT8 target 'nope'"),
        ({"int8": True}, "INT8 export needs calibration images"),
        ({"calib": Path("calib")}, "calib= is only used for INT8"),
        ({"int8": True, "calib": Path("calib"), "calib_size": 0}, "calib_size must be >= 1"),
        ({"quality_images": -1}, "quality_images must be >= 0"),
    ],
)
def test_bad_options_are_refused_with_what_to_do(options: dict, message: str) -> None:
    with pytest.raises(BundleExportError, match=message):
        ExportRequest(**options)


def test_precisions_exported_from_torch_leave_int8_to_quantisation() -> None:
    order = ("fp32", "fp16", "int8")
    assert ExportRequest().precisions(order) == ("fp32",)
    both = ExportRequest(fp16=True, int8=True, calib=Path("calib"))
    assert both.precisions(order) == ("fp32", "fp16")
    with pytest.raises(AttributeError):
        both.fp16 = False  # frozen
