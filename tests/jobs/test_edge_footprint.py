"""The edge-runtime footprint job (``tools.edge_footprint``): runtime-only venvs built from this checkout,
their size on disk, the peak RSS of 100 captions and the cold start to a first caption. It builds venvs (minutes), so
it runs only when asked for::

    EDGECAP_FOOTPRINT_BUNDLE=~/.edgecap/bundles/acort-xsmall EDGECAP_FOOTPRINT_IMAGES=IMAGES_100 \\
    EDGECAP_FOOTPRINT_VARIANTS=cpu,oldest-onnxruntime,py310 EDGECAP_FOOTPRINT_COMPARE_CURRENT=1 \\
    EDGECAP_FOOTPRINT_OUT=/tmp/edge python -m pytest -m footprint tests/jobs/test_edge_footprint.py

Defaults: the session's tiny pixels-in bundle, generated images, the ``cpu`` variant, a temporary ``OUT``.
``OUT`` gets ``edge_runtime.json`` and ``edge_runtime.md`` and keeps the venvs for the next run. The default run
checks one measuring child of this interpreter.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.runtime.bundle.helpers import pixel_bundle
from tools.edge_footprint import TARGETS, format_markdown, measure_env, measure_footprint, write_image_list
from tools.edge_install import clean_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bundle(tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    chosen = os.environ.get("EDGECAP_FOOTPRINT_BUNDLE")
    return Path(chosen).expanduser() if chosen else pixel_bundle(tiny_data, tmp_path_factory)[0]


@pytest.mark.footprint
def test_edge_footprint(bundle: Path, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Every variant installs and captions without torch, within the peak-RSS and cold-start targets."""
    if "footprint" not in (request.config.option.markexpr or ""):
        pytest.skip("builds venvs: python -m pytest -m footprint tests/jobs/test_edge_footprint.py")
    images = os.environ.get("EDGECAP_FOOTPRINT_IMAGES")
    report = measure_footprint(
        bundle,
        Path(os.environ.get("EDGECAP_FOOTPRINT_OUT") or tmp_path),
        images=Path(images).expanduser() if images else None,
        count=int(os.environ.get("EDGECAP_FOOTPRINT_COUNT", "100")),
        variants=[v for v in os.environ.get("EDGECAP_FOOTPRINT_VARIANTS", "cpu").split(",") if v],
        compare_current=os.environ.get("EDGECAP_FOOTPRINT_COMPARE_CURRENT") == "1",
    )
    print(format_markdown(report))
    for row in report["environments"]:
        assert "error" not in row, f"{row['name']}: {row['error']}"
        assert row["torch_imported"] is False, row["name"]
        assert row["peak_rss_mb"] <= TARGETS["rss_mb"], row
        assert row["median"]["cold_start_s"] <= TARGETS["cold_start_s"], row


def test_a_measuring_child_reports_its_peak_and_timings(bundle: Path, tmp_path: Path) -> None:
    listing = write_image_list(None, tmp_path, count=3)
    env = clean_env({"EDGECAP_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)})
    row = measure_env("current", sys.executable, bundle, listing, count=3, cold_runs=1, batch=2, env=env)
    assert "error" not in row, row
    assert row["images"] == 3 and row["torch_imported"] is False
    assert 0 < row["peak_rss_mb"] <= TARGETS["rss_mb"]  # the child's own peak, not this torch-loaded parent's
    assert row["median"]["cold_start_s"] >= row["median"]["first_caption_s"] > 0
