"""``edgecap caption DIR --out X.jsonl``: refusals before work, and exactly once after a kill and ``--resume``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from edgecap.cli import main
from edgecap.runtime.captioner import Captioner
from tests.runtime.bundle.helpers import pixel_bundle
from tests.runtime.collections.helpers import make_collection


@pytest.fixture(scope="module")
def bundle(tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pixel_bundle(tiny_data, tmp_path_factory)[0]


def _no_workers(*args: object, **kwargs: object) -> None:
    raise AssertionError("a worker was started before the refusal")


def test_an_existing_output_without_resume_is_refused_before_any_work(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("edgecap.runtime.collections.run.WorkerPool", _no_workers)
    make_collection(tmp_path / "photos", 3)
    out = tmp_path / "out.jsonl"
    out.write_text('{"path":"x","caption":"y"}\n')
    result = CliRunner().invoke(main, ["caption", str(tmp_path / "photos"), "--out", str(out), "--model", str(bundle)])
    assert result.exit_code != 0 and "--resume" in result.output
    assert out.read_text() == '{"path":"x","caption":"y"}\n'


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["{photos}"], "pass --out"),
        (["{photos}", "--out", "{out}", "--json"], "--json is not for collections"),
        (["{photos}/f00/img00000.png", "--workers", "2"], "--workers is for collections"),
        (["{photos}", "--out", "{out}", "--model", "{photos}"], "no bundle found"),
        (["{photos}", "{photos}/f00", "-r", "--out", "{out}"], "give each image once"),
        (["{photos}", "--out", "{photos}/x.parquet"], "written by --ray"),
        (
            [
                "{photos}/f00/img00000.png",
                "{photos}/f00/img00001.png",
                "--out",
                "{photos}/f00/img00001.png",
                "--resume",
            ],
            "is one of the images given",
        ),
    ],
)
def test_a_collection_is_checked_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], says: str
) -> None:
    monkeypatch.setattr("edgecap.runtime.collections.run.WorkerPool", _no_workers)
    make_collection(tmp_path / "photos", 2, folders=1)
    words = [a.format(photos=tmp_path / "photos", out=tmp_path / "out.jsonl") for a in args]
    result = CliRunner().invoke(main, ["caption", *words])
    assert result.exit_code != 0 and says in result.output, result.output
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize(("given", "address"), [([], None), (["10.0.0.5:6379"], "10.0.0.5:6379")])
def test_ray_gets_the_collection_and_the_load_options(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: list[str], address: str | None
) -> None:
    calls: list[tuple[tuple, dict]] = []
    monkeypatch.setattr(
        "edgecap.runtime.collections.ray_job.caption_with_ray", lambda *a, **k: calls.append((a, k)) or 7
    )
    make_collection(tmp_path / "photos", 2, folders=1)
    out = tmp_path / "out.jsonl"
    args = ["caption", str(tmp_path / "photos"), "-r", "--out", str(out), "--model", str(bundle), "--workers", "3"]
    result = CliRunner().invoke(main, [*args, "--threads", "2", "--length-level", "2", "--ray", *given])
    assert result.exit_code == 0, result.output
    assert "wrote 7 line(s)" in result.output
    [(positional, keywords)] = calls
    assert positional == ([tmp_path / "photos"], out)
    assert keywords == {
        "bundle": bundle, "address": address, "recursive": True, "resume": False, "workers": 3, "runtime": "auto",
        "precision": "auto", "threads": 2, "beam": None, "length_level": 2,
    }  # fmt: skip


def test_a_ray_address_where_nothing_answers_fails_in_seconds(bundle: Path, tmp_path: Path) -> None:
    import socket

    make_collection(tmp_path / "photos", 2, folders=1)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    out = tmp_path / "out.jsonl"
    started = time.monotonic()
    args = ["caption", str(tmp_path / "photos"), "--out", str(out), "--model", str(bundle), "--ray", address]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and f"cannot reach the Ray cluster at {address}" in result.stderr, result.output
    assert time.monotonic() - started < 30 and not out.exists()


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_a_run_killed_half_way_and_resumed_captions_every_image_exactly_once(bundle: Path, tmp_path: Path) -> None:
    paths = make_collection(tmp_path / "photos", 200, folders=5, bad=3)
    out = tmp_path / "captions.jsonl"
    command = [sys.executable, "-m", "edgecap", "caption", str(tmp_path / "photos"), "--recursive", "--out", str(out)]
    command += ["--model", str(bundle), "--workers", "2", "--threads", "1"]
    run = subprocess.Popen(command, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while _lines(out) < 64 and run.poll() is None and time.monotonic() < deadline:  # the first chunk is written
        time.sleep(0.002)
    workers = psutil.Process(run.pid).children() if run.poll() is None else []
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    killed_at = _lines(out)
    assert 0 < killed_at < len(paths), f"not killed mid-run ({killed_at} lines): {run.stderr.read()!r}"  # type: ignore[union-attr]
    _, alive = psutil.wait_procs(workers, timeout=10)  # the workers die with the run: none captions for no one
    assert all(p.status() == psutil.STATUS_ZOMBIE for p in alive), alive
    result = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["path"] for r in records] == [str(p) for p in paths]  # every image once, in listing order
    good = [str(p) for p in paths if p.suffix == ".png"]
    with Captioner.load(bundle, threads=1) as captioner:
        expected = dict(zip(good, captioner.batch(good), strict=True))
    assert {r["path"]: r["caption"] for r in records if "caption" in r} == expected
    assert sorted(r["path"] for r in records if "error" in r) == [str(p) for p in paths if p.suffix == ".jpg"]
