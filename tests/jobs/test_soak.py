"""The soak job: one ``Captioner`` serving several threads for minutes on good and broken images
(``tools.soak``). Long, so it runs only when asked for::

    EDGECAP_SOAK_BUNDLE=~/.edgecap/bundles/acort-xsmall EDGECAP_SOAK_MINUTES=10 EDGECAP_SOAK_OUT=soak \\
        python -m pytest -m soak tests/jobs/test_soak.py

Without ``EDGECAP_SOAK_BUNDLE`` it soaks the session's tiny pixels-in bundle; ``EDGECAP_SOAK_THREADS`` sets the
threads (4). ``EDGECAP_SOAK_OUT`` gets ``soak.json`` and ``soak.md``. The default run checks the same machinery for a
few seconds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.runtime.bundle.helpers import pixel_bundle
from tools.soak import make_images, rss_summary, run_soak, write_soak_report


def _asked_for(config: pytest.Config, marker: str) -> bool:
    """Whether ``-m`` names ``marker`` (a long job runs only then)."""
    return marker in (config.option.markexpr or "")


@pytest.fixture(scope="module")
def bundle(tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> str:
    return os.environ.get("EDGECAP_SOAK_BUNDLE") or str(pixel_bundle(tiny_data, tmp_path_factory)[0])


@pytest.mark.soak
def test_soak(bundle: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Minutes of threaded captioning: no caption differs from its serial one, every bad image is an ImageError,
    RSS stays within its bound after the warm-up."""
    if not _asked_for(request.config, "soak"):
        pytest.skip("long: python -m pytest -m soak tests/jobs/test_soak.py")
    report = run_soak(
        bundle,
        minutes=float(os.environ.get("EDGECAP_SOAK_MINUTES", "10")),
        threads=int(os.environ.get("EDGECAP_SOAK_THREADS", "4")),
    )
    write_soak_report(report, Path(os.environ.get("EDGECAP_SOAK_OUT") or tmp_path))
    assert report["mismatches"] == [] and report["errors"] == [], json.dumps(report["errors"] or report["mismatches"])
    assert report["rss"]["passed"] is True, report["rss"]
    assert report["counts"]["good"] > 0 and report["counts"]["bad_image_error"] > 0


def test_a_short_soak_passes(bundle: str, tmp_path: Path) -> None:
    report = run_soak(bundle, minutes=0.05, threads=2, good=4, bad=6)
    assert report["passed"] and report["error_count"] == report["mismatch_count"] == 0
    assert report["counts"]["good"] > 0 and report["counts"]["bad_image_error"] > 0
    write_soak_report(report, tmp_path)
    assert json.loads((tmp_path / "soak.json").read_text())["passed"] is True
    assert "**PASS**" in (tmp_path / "soak.md").read_text()


def test_every_broken_image_kind_is_made(tmp_path: Path) -> None:
    good, bad = make_images(tmp_path, good=2, bad=6, seed=0)
    assert [p.suffix for p in good] == [".png", ".jpeg"]
    assert {p.stem.split("-", 2)[2] for p in bad} == {"truncated-png", "truncated-jpeg", "garbage", "empty", "text",
                                                      "spliced"}  # fmt: skip


def test_rss_growth_is_judged_after_the_warmup_only() -> None:
    flat_after_warmup = [(float(t), 100.0 + (50.0 if t < 10 else 0.0) + (5.0 if t >= 10 else 0.0)) for t in range(30)]
    summary = rss_summary(flat_after_warmup, warmup_s=10, bound_mb=1.0)
    assert summary["growth_after_warmup_mb"] == 0.0 and summary["passed"] is True
    growing = [(float(t), 100.0 + t) for t in range(30)]
    assert rss_summary(growing, warmup_s=10, bound_mb=5.0)["passed"] is False
    assert rss_summary(growing[:3], warmup_s=0, bound_mb=5.0)["passed"] is None
