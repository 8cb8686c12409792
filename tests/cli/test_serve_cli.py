"""``edgecap serve`` and ``edgecap triton-repo`` from the command line (the real server: tests/runtime/serving)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgecap.cli import main
from tests.runtime.bundle.helpers import pixel_bundle


@pytest.fixture(scope="module")
def bundle(tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pixel_bundle(tiny_data, tmp_path_factory)[0]


@pytest.mark.skipif(importlib.util.find_spec("pytriton") is not None, reason="the [serve] extra is installed here")
def test_serve_without_the_server_says_what_to_install(bundle: Path) -> None:
    result = CliRunner().invoke(main, ["serve", str(bundle)])
    assert result.exit_code != 0 and "pip install 'edgecap[serve]'" in result.output


def test_serve_needs_bundles_or_a_repository(tmp_path: Path, bundle: Path) -> None:
    assert "give BUNDLES or --model-repository" in CliRunner().invoke(main, ["serve"]).output
    both = CliRunner().invoke(main, ["serve", str(bundle), "--model-repository", str(tmp_path)])
    assert "give BUNDLES or --model-repository" in both.output


def test_triton_repo_writes_a_repository_and_refuses_to_overwrite_it(bundle: Path, tmp_path: Path) -> None:
    dest = tmp_path / "models"
    args = ["triton-repo", str(bundle), str(dest), "--max-batch", "32", "--instances", "2", "--threads", "2"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    config = (dest / bundle.name / "config.pbtxt").read_text()
    assert "max_batch_size: 32" in config and "count: 2" in config and 'string_value: "2"' in config
    again = CliRunner().invoke(main, args)
    assert again.exit_code != 0 and "already exists" in again.output


def test_triton_repo_inside_its_bundle_is_refused_at_once(bundle: Path) -> None:
    result = CliRunner().invoke(main, ["triton-repo", str(bundle), str(bundle / "repo")])
    assert result.exit_code == 1 and "is inside the bundle" in result.stderr and not (bundle / "repo").exists()
    assert len(result.stderr.strip().splitlines()) == 1


def test_triton_repo_of_a_missing_bundle_fails_cleanly(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["triton-repo", str(tmp_path / "nope"), str(tmp_path / "models")])
    assert result.exit_code != 0 and "no bundle found" in result.output and not (tmp_path / "models").exists()


@pytest.mark.parametrize("flag,value", [("--max-batch", "0"), ("--instances", "0"), ("--max-queue-size", "-1")])
def test_absurd_numbers_are_usage_errors(bundle: Path, tmp_path: Path, flag: str, value: str) -> None:
    result = CliRunner().invoke(main, ["triton-repo", str(bundle), str(tmp_path / "m"), flag, value])
    assert result.exit_code == 2 and flag in result.output


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server counts as installed, and nothing starts: reaching the work folder exits with status 7."""
    from edgecap.runtime.serving import lockdown, server

    monkeypatch.setattr(server.TritonDistribution, "find", classmethod(lambda cls: None))
    monkeypatch.setattr(lockdown, "work_folder", lambda: (_ for _ in ()).throw(SystemExit(7)))
    monkeypatch.delenv("EDGECAP_SERVE_TOKEN", raising=False)


def test_a_public_host_without_a_token_warns_before_anything_starts(
    installed: None, bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.runtime.serving.conftest import free_ports

    ports = [str(p) for p in free_ports(3)]
    args = ["serve", str(bundle), "--host", "0.0.0.0", "--http-port", ports[0], "--grpc-port", ports[1]]
    args += ["--metrics-port", ports[2]]
    warned = CliRunner().invoke(main, args)
    assert warned.exit_code == 7 and "Warning: listening on 0.0.0.0 without authentication" in warned.output
    assert "EDGECAP_SERVE_TOKEN" in warned.output
    local = CliRunner().invoke(main, [*args[:2], *args[4:]])
    assert local.exit_code == 7 and "Warning" not in local.output
    monkeypatch.setenv("EDGECAP_SERVE_TOKEN", "0123456789abcdef")
    guarded = CliRunner().invoke(main, args)
    assert guarded.exit_code == 7 and "Warning" not in guarded.output


def test_refusals_before_start(installed: None, bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    same = CliRunner().invoke(main, ["serve", str(bundle), "--http-port", "9100", "--metrics-port", "9100"])
    assert same.exit_code == 1 and "--http-port and --metrics-port are both 9100" in same.output
    assert len(same.output.splitlines()) == 1  # not Triton's usage text
    empty = CliRunner().invoke(main, ["serve", "--model-repository", str(tmp_path)])
    assert empty.exit_code == 1 and f"no models in {tmp_path}" in empty.output
    monkeypatch.setenv("EDGECAP_SERVE_TOKEN", "short")
    weak = CliRunner().invoke(main, ["serve", str(bundle)])
    assert weak.exit_code == 1 and "EDGECAP_SERVE_TOKEN must be 16 to 256" in weak.output
