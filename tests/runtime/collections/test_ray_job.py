"""``caption_with_ray`` on a local Ray cluster of 2 CPUs (one for the module): the captions a direct
``Captioner.batch`` gives, error records for bad files, JSONL in listing order (several windows), Parquet, resume,
and outputs refused before any Ray work."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'edgecap[ray]')")

from edgecap.runtime.collections import ray_job  # noqa: E402 (after the skip: the module needs nothing of Ray)
from edgecap.runtime.collections.journal import JournalError  # noqa: E402
from edgecap.runtime.collections.ray_job import _last_line, _Names, actor_cpus, caption_with_ray  # noqa: E402

GOOD, BAD = 30, 2


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """One light, quiet local cluster for the module (no dashboard, no usage report, no progress bars)."""
    saved = {k: os.environ.get(k) for k in ("RAY_USAGE_STATS_ENABLED", "RAY_AUTH_MODE")}
    os.environ.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=128 * 2**20)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    try:
        yield
    finally:
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def case(tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A pixels-in bundle, a collection of 30 small PNGs in 3 folders plus 2 bad files, in listing order, and the
    captions a direct ``Captioner.batch`` gives each good one."""
    from edgecap.runtime.captioner import Captioner
    from edgecap.runtime.images.load import ImageError, load_image
    from tests.runtime.bundle.helpers import pixel_bundle

    bundle, _ = pixel_bundle(tiny_data, tmp_path_factory)
    root = tmp_path_factory.mktemp("ray-collection") / "photos"
    rng = np.random.default_rng(0)
    for i in range(GOOD):
        (root / f"f{i % 3}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (24 + i, 20, 3), dtype=np.uint8)).save(root / f"f{i % 3}" / f"{i:03d}.png")
    (root / "f0" / "bad0.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    (root / "f1" / "bad1.png").write_bytes(b"")
    listed = sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: p.relative_to(root).parts)
    good = [str(p) for p in listed if "bad" not in p.name]
    with Captioner.load(bundle, threads=1) as cap:
        captions = dict(zip(good, cap.batch(good), strict=True))
    errors = {}
    for path in (str(p) for p in listed if "bad" in p.name):
        with pytest.raises(ImageError) as caught:
            load_image(path)
        errors[path] = str(caught.value)  # what `edgecap caption` says of the file
    return {"bundle": bundle, "root": root, "listed": [str(p) for p in listed], "captions": captions, "errors": errors}


def _run(case: dict[str, Any], out: Path, **kwargs: Any) -> int:
    options: dict[str, Any] = {"address": None, "recursive": True, "resume": False, "workers": 2}
    options |= {"runtime": "onnxruntime", "precision": "fp32", "threads": "auto", "beam": None, "length_level": None}
    return caption_with_ray([case["root"]], out, bundle=case["bundle"], **(options | kwargs))


def _check_records(case: dict[str, Any], records: list[dict[str, str]]) -> None:
    assert [r["path"] for r in records] == case["listed"]  # listing order, each image exactly once
    for record in records:
        if "bad" in record["path"]:
            assert record == {"path": record["path"], "error": case["errors"][record["path"]]}
        else:
            assert record == {"path": record["path"], "caption": case["captions"][record["path"]]}


def test_jsonl_has_the_direct_captions_in_listing_order(
    cluster: None, case: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray_job, "WINDOW", 20)  # two datasets, the second one shorter
    out = tmp_path / "captions.jsonl"
    assert _run(case, out) == GOOD + BAD
    text = out.read_text(encoding="utf-8")
    _check_records(case, [json.loads(line) for line in text.splitlines()])
    first = json.loads(text.splitlines()[0])
    assert text.startswith(json.dumps(first, ensure_ascii=False, separators=(",", ":")) + "\n")  # the shared format
    assert sum('"error":' in line for line in text.splitlines()) == BAD


def test_parquet_has_one_row_per_image(cluster: None, case: dict[str, Any], tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    out = tmp_path / "captions.parquet"
    assert _run(case, out, threads=1) == GOOD + BAD
    table = pq.read_table(out)
    assert [(f.name, str(f.type)) for f in table.schema] == [("path", "string"), ("caption", "string")] + [
        ("error", "string")
    ]
    rows = sorted(table.to_pylist(), key=lambda r: case["listed"].index(r["path"]))
    _check_records(case, [{k: v for k, v in r.items() if v is not None} for r in rows])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["captions.parquet"]  # no partial directory left


def test_resume_writes_only_the_images_after_the_last_line(cluster: None, case: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "captions.jsonl"
    done = case["listed"][:12]
    head = "".join(json.dumps({"path": p, "caption": "kept as written"}) + "\n" for p in done)
    out.write_text(head + '{"path": "half a li', encoding="utf-8")  # a writer killed mid-line
    assert _run(case, out, resume=True) == len(case["listed"]) - 12
    lines = out.read_text(encoding="utf-8").splitlines()
    assert "\n".join(lines[:12]) + "\n" == head
    records = [json.loads(line) for line in lines]
    assert [r["path"] for r in records] == case["listed"]
    _check_records({**case, "listed": case["listed"][12:]}, records[12:])
    assert _run(case, out, resume=True) == 0  # nothing left: no Ray job at all


def test_resume_recaptions_the_image_of_a_damaged_middle_line(
    cluster: None, case: dict[str, Any], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "captions.jsonl"
    done = case["listed"][:12]
    lines = [json.dumps({"path": p, "caption": "kept as written"}) + "\n" for p in done]
    lines[4] = "{garbage\n"
    out.write_text("".join(lines), encoding="utf-8")
    assert _run(case, out, resume=True) == len(case["listed"]) - 12 + 1
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["path"] for r in records] == case["listed"]  # the lost image at its place, every image once
    _check_records({**case, "listed": [case["listed"][4]]}, [records[4]])
    assert "1 damaged line(s) (line 5) dropped; 1 image(s)" in capfd.readouterr().err


def test_an_address_where_nothing_answers_is_refused_in_seconds_before_any_output(
    case: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket
    import time

    def no_cluster(address: str | None) -> None:
        raise AssertionError("ray.init was tried for an address where nothing answers")

    monkeypatch.setattr(ray_job, "_cluster", no_cluster)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(RuntimeError, match=f"cannot reach the Ray cluster at {address} "):
            _run(case, tmp_path / "captions.jsonl", address=address)
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(RuntimeError, match="cannot reach the Ray cluster"):
        _run(case, tmp_path / "captions.jsonl")
    assert time.monotonic() - started < 30 and list(tmp_path.iterdir()) == []
    for bad in ("nonsense", "host:port", "h:0", ":6379"):
        with pytest.raises(ValueError, match="give HOST:PORT"):
            ray_job.check_reachable(bad)
    ray_job.check_reachable("auto")  # Ray's to find


def test_outputs_and_arguments_are_refused_before_any_ray_work(
    case: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_cluster(address: str | None) -> None:
        raise AssertionError("Ray was started for a run that should have been refused")

    monkeypatch.setattr(ray_job, "_cluster", no_cluster)
    existing = tmp_path / "captions.jsonl"
    existing.write_text('{"path":"x","caption":"y"}\n')
    with pytest.raises(JournalError, match="already exists"):
        _run(case, existing)
    assert existing.read_text() == '{"path":"x","caption":"y"}\n'
    (tmp_path / "old.parquet").mkdir()
    with pytest.raises(ValueError, match="already exists"):
        _run(case, tmp_path / "old.parquet")
    with pytest.raises(ValueError, match="--resume continues a .jsonl"):
        _run(case, tmp_path / "new.parquet", resume=True)
    with pytest.raises(ValueError, match=r"name a \.jsonl file or a \.parquet directory"):
        _run(case, tmp_path / "captions.csv")
    with pytest.raises(ValueError, match="workers must be >= 1"):
        _run(case, tmp_path / "new.jsonl", workers=0)
    with pytest.raises(ValueError, match="not a directory"):
        caption_with_ray(
            [case["root"]], tmp_path / "new.jsonl", bundle=tmp_path / "nope", address=None, recursive=True,
            resume=False, workers=1, runtime="auto", precision="auto", threads="auto", beam=None, length_level=None,
        )  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["captions.jsonl", "old.parquet"]


def test_actor_cpus_split_the_cluster_or_take_the_thread_count() -> None:
    assert actor_cpus("auto", 2, 2.0) == 1 and actor_cpus(0, 3, 16.0) == 5 and actor_cpus("dedicated", 4, 2.0) == 0.5
    assert actor_cpus(2, 3, 8.0) == 2
    with pytest.raises(ValueError, match="need 6 CPUs; the Ray cluster has 4"):
        actor_cpus(3, 2, 4.0)


def test_names_map_absolute_paths_back_to_the_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "a" / "link").symlink_to(tmp_path / "elsewhere")  # a source inside another only through a link
    (tmp_path / "one.png").write_bytes(b"")
    names = _Names.of([Path("a"), Path("a/link"), Path("one.png")])
    monkeypatch.chdir(tmp_path / "elsewhere")  # an actor's working directory is not the driver's
    assert names.listed(str(tmp_path / "a" / "b" / "x.png")) == "a/b/x.png"
    assert names.listed(str(tmp_path / "a" / "link" / "y.png")) == "a/link/y.png"
    assert names.listed(str(tmp_path / "one.png")) == "one.png"
    with pytest.raises(ValueError, match="not below any of the sources"):
        names.listed(str(tmp_path / "elsewhere" / "y.png"))


def test_a_ray_error_is_told_by_its_last_line() -> None:
    """A failed actor's error text is its remote traceback: the last line, without the module path, is the message
    (a failing actor is not run here: Ray retries its creation for about half a minute)."""
    remote = 'The actor died\n  File "x.py", line 3, in __init__\nedgecap.runtime.length.LengthLevelError: no level\n'
    assert _last_line(RuntimeError(remote)) == "LengthLevelError: no level"
    assert _last_line(RuntimeError("")) == "RuntimeError"
