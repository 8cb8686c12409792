"""A directory is a bundle (``manifest.json``), a training run (``config.json`` with the run's sections) or neither;
every entry point says which it expected and what it found, never ``KeyError``."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from edgecap import Captioner
from edgecap.cli import main
from edgecap.runtime.bundle import BundleNotFoundError
from edgecap.runtime.bundle.layout import directory_kind
from edgecap.runtime.bundle.manifest import MANIFEST_NAME
from edgecap.workshop.training.checkpoint import NotARunError
from tests.runtime.bundle.helpers import copy_bundle, pixel_bundle, pixel_run

HALF_COPIED = "has config.json but no manifest.json: not a bundle (a half-copied bundle?) and not a training run"


@pytest.fixture(scope="module")
def bundle(tiny_data, tmp_path_factory) -> Path:
    return pixel_bundle(tiny_data, tmp_path_factory)[0]


@pytest.fixture(scope="module")
def run(tiny_data, tmp_path_factory) -> Path:
    return pixel_run(tiny_data, tmp_path_factory)[0]


@pytest.fixture
def half(bundle: Path, tmp_path: Path) -> Path:
    """A bundle copied without its manifest."""
    copy = copy_bundle(bundle, tmp_path / "half")
    (copy / MANIFEST_NAME).unlink()
    return copy


@pytest.fixture(scope="module")
def image(tiny_data) -> Path:
    return sorted((tiny_data[0] / "images").iterdir())[0]


def test_directory_kind_never_guesses(bundle: Path, run: Path, half: Path, tmp_path: Path):
    assert directory_kind(bundle) == "bundle" and directory_kind(run) == "run"
    assert directory_kind(half) == "config-only" and directory_kind(tmp_path / "none") == "missing"
    (tmp_path / "empty").mkdir()
    assert directory_kind(tmp_path / "empty") == "neither"


def test_from_run_on_a_bundle_says_it_is_a_bundle(bundle: Path):
    with pytest.raises(NotARunError, match="is a bundle, not a training run: use Captioner.load"):
        Captioner.from_run(bundle)


def test_from_run_on_a_bundle_without_manifest_says_what_it_found(half: Path):
    with pytest.raises(NotARunError, match=r"a half-copied bundle\?"):
        Captioner.from_run(half)


def test_load_on_a_run_says_it_is_a_run(run: Path):
    with pytest.raises(BundleNotFoundError, match="is a training run, not a bundle: use Captioner.from_run"):
        Captioner.load(run)


def test_load_on_a_bundle_without_manifest_says_what_it_found(half: Path):
    with pytest.raises(BundleNotFoundError, match=r"a half-copied bundle\?"):
        Captioner.load(half)


def _check(result, expected: str) -> None:
    assert result.exit_code == 1, result.output
    assert not isinstance(result.exception, KeyError) and "Traceback" not in result.output
    assert expected in result.output, result.output


def test_caption_with_a_bundle_without_manifest(half: Path, image: Path):
    _check(CliRunner().invoke(main, ["caption", str(image), "--model", str(half)]), HALF_COPIED)


def test_export_of_a_bundle_without_manifest(half: Path, tmp_path: Path):
    result = CliRunner().invoke(main, ["export", "--model", str(half), "--out", str(tmp_path / "out"), "--quiet"])
    _check(result, HALF_COPIED)


@pytest.mark.parametrize("which", ["bundle", "half"])
def test_eval_refuses_what_is_not_a_run(which: str, bundle: Path, half: Path):
    path = bundle if which == "bundle" else half
    result = CliRunner().invoke(main, ["eval", str(path), "--device", "cpu"])
    _check(result, "is a bundle, not a training run" if which == "bundle" else HALF_COPIED)
