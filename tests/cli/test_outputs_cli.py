"""Every command that writes an output directory checks it before any work
(``edgecap.runtime._io.check_output_location``):
a read-only place, a file in the way, a name too long or a concurrent writer is one clear line in a second, not a
traceback after the work, and nothing already there is lost."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgecap.cli import main
from edgecap.runtime import _io

READ_ONLY = "/sys/kernel/edgecap-out"  # takes no new entries, not even from root (chmod would not stop root)
LONG = "b" * 300


@pytest.fixture
def no_export_work(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("export started its work before refusing --out")

    monkeypatch.setattr("edgecap.workshop.export.bundle.load_source", refuse)


def _refused(args: list[str], expected: str) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    assert expected in result.output and "Traceback" not in result.output
    assert not isinstance(result.exception, AssertionError), result.exception
    return result.output


@pytest.mark.parametrize(("out", "expected"), [(READ_ONLY, "cannot write to /sys/kernel"), (LONG, "300 bytes")])
def test_export_checks_out_before_any_work(tmp_path: Path, no_export_work: None, out: str, expected: str) -> None:
    _refused(["export", "--model", "acort-xsmall", "--out", str(tmp_path / out)], expected)


def test_export_overwrite_onto_a_read_only_bundle_is_refused_before_any_work(
    tmp_path: Path, no_export_work: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text("{}")
    real_probe = _io._probe_write

    def read_only_bundle(directory: Path) -> OSError | None:  # a read-only mount, as root sees it
        return OSError(30, "Read-only file system") if Path(directory) == bundle else real_probe(directory)

    monkeypatch.setattr(_io, "_probe_write", read_only_bundle)
    _refused(["export", "--model", "acort-xsmall", "--out", str(bundle), "--overwrite"], "Read-only file system")
    assert (bundle / "manifest.json").read_text() == "{}"


def test_a_second_export_to_the_same_out_is_refused_while_the_first_runs(tmp_path: Path, no_export_work: None) -> None:
    out = tmp_path / "bundle"
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # the first exporter, mid-way
    try:
        (tmp_path / ".bundle.lock").write_text(f"{first.pid}\n")
        _refused(
            ["export", "--model", "acort-xsmall", "--out", str(out)],
            f"being written by another process (pid {first.pid})",
        )
    finally:
        first.kill()
        first.wait()
    assert not out.exists()


@pytest.mark.parametrize(("out", "expected"), [(READ_ONLY, "cannot write to /sys/kernel"), (LONG, "300 bytes")])
def test_data_synth_checks_out_first(tmp_path: Path, out: str, expected: str) -> None:
    _refused(["data", "synth", "--out", str(tmp_path / out), "--images", "5", "--no-progress"], expected)


def test_import_checks_out_first(tmp_path: Path) -> None:
    checkpoint = tmp_path / "model.pth"
    checkpoint.write_bytes(b"not read")
    _refused(["import", "--from", "acort", str(checkpoint), "--out", READ_ONLY], "cannot write to /sys/kernel")
    (tmp_path / "run").write_text("a file")
    _refused(["import", "--from", "acort", str(checkpoint), "--out", str(tmp_path / "run")], "not a directory")


def test_features_and_train_check_out_first(tiny_data: tuple[Path, Path], tmp_path: Path) -> None:
    data = tiny_data[0]
    _refused(["features", "--data", str(data), "--out", READ_ONLY], "cannot write to /sys/kernel")
    features = tmp_path / "features"
    features.mkdir()
    args = ["train", "--data", str(data), "--features", str(features), "--out", READ_ONLY]
    _refused(args, "cannot write to /sys/kernel")
