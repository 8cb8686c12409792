"""``edgecap bench`` refuses absurd numbers and unwritable report locations before it measures anything: a typo
(``--batch 1000000000``) or a read-only ``--out`` must cost a second, not the whole measurement."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from edgecap.bench import run as bench_run
from edgecap.bench.harness import MAX_BATCH, MAX_MIN_SECONDS, MAX_REPEATS, MAX_SYNTHETIC, MAX_WARMUP, LoopCfg
from edgecap.bench.run import BenchCfg, BenchCfgError
from edgecap.cli.bench import bench


@pytest.fixture
def no_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("measured before refusing")

    monkeypatch.setattr(bench_run, "run_benchmark", refuse)
    monkeypatch.setattr("edgecap.cli.bench.bench_cfg", lambda flags: None)  # any flag problem is not the point here


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batches": (1, MAX_BATCH + 1)}, "MAX_BATCH"),
        ({"synthetic": MAX_SYNTHETIC + 1}, "synthetic"),
        ({"max_images": 10**9}, "max_images"),
        ({"warmup": MAX_WARMUP + 1}, "MAX_WARMUP"),
        ({"min_seconds": MAX_MIN_SECONDS * 2}, "MAX_MIN_SECONDS"),
        ({"max_repeats": MAX_REPEATS + 1}, "MAX_REPEATS"),
    ],
)
def test_absurd_numbers_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(BenchCfgError, match=match):
        BenchCfg(bundles=("b",), **kwargs)


def test_the_bounds_leave_real_measurements_alone() -> None:
    cfg = BenchCfg(bundles=("b",), batches=(1, MAX_BATCH), synthetic=MAX_SYNTHETIC, max_repeats=MAX_REPEATS)
    assert cfg.batches == (1, MAX_BATCH)
    assert LoopCfg(MAX_WARMUP, 1, MAX_MIN_SECONDS, MAX_REPEATS).max_repeats == MAX_REPEATS


def test_cli_refuses_a_huge_batch_at_once() -> None:
    result = CliRunner().invoke(bench, ["--bundle", "B", "--out", "o", "--batch", "1000000000"])
    assert result.exit_code != 0 and f"at most MAX_BATCH ({MAX_BATCH})" in result.output
    assert "Traceback" not in result.output


def test_out_pointing_at_a_file_is_refused_before_measuring(tmp_path: Path, no_measuring: None) -> None:
    out = tmp_path / "report.json"
    out.write_text("{}")
    result = CliRunner().invoke(bench, ["--bundle", "B", "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert "exists and is not a directory" in result.output
    assert out.read_text() == "{}"


def test_out_on_a_read_only_location_is_refused_before_measuring(no_measuring: None) -> None:
    # /sys refuses new entries even to root (chmod would not stop root)
    result = CliRunner().invoke(bench, ["--bundle", "B", "--out", "/sys/kernel/edgecap-bench-report"])
    assert result.exit_code == 1, result.output
    assert "cannot write to /sys/kernel" in result.output


def test_compare_out_is_checked_before_reading_the_reports(tmp_path: Path) -> None:
    result = CliRunner().invoke(bench, ["--compare", "a.json", "b.json", "--out", "/sys/kernel/edgecap-compare"])
    assert result.exit_code == 1 and "cannot write to /sys/kernel" in result.output
