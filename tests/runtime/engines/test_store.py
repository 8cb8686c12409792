"""The engine cache key and the rules for loading a stored engine set (no TensorRT needed)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from edgecap.runtime.engines.store import (
    RECORD_NAME,
    EngineEnv,
    EngineMismatchError,
    EngineRecordError,
    check_record,
    engine_key,
    find_engines,
    fitting_engines,
    read_record,
    verify_plans,
)

ENV = EngineEnv("10.3.0.30", "Orin", "8.7")
SHAS = {"encoder": "a" * 64, "step": "b" * 64}
PROFILES = {"encoder": "1" * 64, "step": "2" * 64}


def key(**changes) -> str:
    args = {
        "env": ENV,
        "precision": "fp16",
        "profile_digests": PROFILES,
        "graph_sha256": SHAS,
        "max_batch": 8,
        "beam": 3,
    }
    args.update(changes)
    return engine_key(**args)


def test_the_key_changes_with_everything_an_engine_depends_on() -> None:
    base = key()
    assert base.startswith("fp16-b8-k3-") and len(base.rsplit("-", 1)[1]) == 16 and key() == base
    variants = [
        key(env=EngineEnv("10.12.0.36", "Orin", "8.7")),
        key(env=EngineEnv("10.3.0.30", "NVIDIA H100 80GB HBM3", "8.7")),
        key(env=EngineEnv("10.3.0.30", "Orin", "9.0")),
        key(precision="int8"),
        key(profile_digests={**PROFILES, "step": "3" * 64}),
        key(graph_sha256={**SHAS, "step": "c" * 64}),
    ]
    assert len({base, *variants}) == len(variants) + 1


def record(**changes) -> dict:
    data = {
        "format": "edgecap-engines",
        "format_version": 1,
        "precision": "fp16",
        "env": {"trt_version": ENV.trt_version, "gpu_name": ENV.gpu_name, "compute_capability": ENV.compute_capability},
        "request": {"max_batch": 8, "beam": 3},
        "engines": {role: {"graph_sha256": sha, "plan": f"{role}.plan"} for role, sha in SHAS.items()},
        "gathers": {},
    }
    data.update(changes)
    return data


def test_check_record_names_each_difference() -> None:
    assert check_record(record(), ENV, SHAS, "fp16") == []
    problems = check_record(record(), EngineEnv("11.0.0.114", "NVIDIA H100 80GB HBM3", "9.0"), SHAS, "int8")
    assert problems == [
        "precision fp16, not int8",
        "built with TensorRT 10.3.0.30, this is TensorRT 11.0.0.114",
        "built on Orin (compute capability 8.7), this is NVIDIA H100 80GB HBM3 (9.0)",
    ]
    (stale,) = check_record(record(), ENV, {**SHAS, "step": "d" * 64}, "fp16")
    assert "step engine was built from graph bbbbbbbbbbbb" in stale and "re-exported since" in stale
    assert check_record(record(engines={}), ENV, SHAS, "fp16") == ["no encoder engine", "no step engine"]


def _store(root: Path, name: str, data: dict, plans: bool = True) -> Path:
    folder = root / "engines" / name
    folder.mkdir(parents=True)
    for entry in data["engines"].values():
        if plans:
            (folder / entry["plan"]).write_bytes(entry["plan"].encode())
            entry["plan_sha256"] = hashlib.sha256(entry["plan"].encode()).hexdigest()
    (folder / RECORD_NAME).write_text(json.dumps(data))
    return folder


def test_find_engines_picks_a_fitting_set_and_explains_a_refusal(tmp_path: Path) -> None:
    with pytest.raises(EngineMismatchError, match=r"has no fp16 TensorRT engine for TensorRT 10\.3\.0\.30 on Orin"):
        find_engines(tmp_path, "fp16", ENV, SHAS)
    small = _store(tmp_path, "fp16-b2-k3-x", record(request={"max_batch": 2, "beam": 3}))
    large = _store(tmp_path, "fp16-b8-k3-y", record())
    _store(tmp_path, "int8-b8-k3-z", record(precision="int8"))
    assert find_engines(tmp_path, "fp16", ENV, SHAS)[0] == large  # the largest batch shape that fits
    other = EngineEnv("10.3.0.30", "Orin", "9.0")
    with pytest.raises(EngineMismatchError, match="fp16-b2-k3-x: built on Orin") as err:
        find_engines(tmp_path, "fp16", other, SHAS)
    assert "fp16-b8-k3-y" in str(err.value) and "int8" not in str(err.value)
    assert small.is_dir()
    verify_plans(large, read_record(large))
    (large / "step.plan").write_bytes(b"changed")
    with pytest.raises(EngineRecordError, match="step.plan: SHA-256 differs"):
        verify_plans(large, read_record(large))
    (large / "step.plan").unlink()
    with pytest.raises(EngineRecordError, match="'step.plan' is missing"):
        verify_plans(large, read_record(large))


def test_unreadable_records(tmp_path: Path) -> None:
    with pytest.raises(EngineRecordError, match="no engine.json"):
        read_record(tmp_path)
    (tmp_path / RECORD_NAME).write_text("{")
    with pytest.raises(EngineRecordError, match="unreadable"):
        read_record(tmp_path)
    (tmp_path / RECORD_NAME).write_text(json.dumps({"format": "other"}))
    with pytest.raises(EngineRecordError, match="not an edgecap engine record"):
        read_record(tmp_path)
    (tmp_path / RECORD_NAME).write_text(json.dumps(record(format_version=9)))
    with pytest.raises(EngineRecordError, match="newer edgecap"):
        read_record(tmp_path)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[1, 2]", "a JSON list, not an object"),
        ('"engine"', "a JSON str, not an object"),
        (json.dumps(record(format_version="x")), "format_version 'x' is not an integer"),
        (json.dumps({k: v for k, v in record().items() if k != "env"}), "lacks 'env'"),
        (json.dumps(record(env=["Orin"])), "'env' is a list, not a dict"),
        (json.dumps(record(precision=16)), "'precision' is a int, not a str"),
        (json.dumps(record(engines={"step": "step.plan"})), r"engines\['step'\] is not an object"),
        (json.dumps(record(gathers=[])), "'gathers' is a list, not an object"),
        (json.dumps(record(request={"max_batch": "8", "beam": 3})), "request.max_batch '8' is not a positive"),
        (b"\xff\xfe{".decode("latin-1"), "unreadable"),
    ],
)
def test_every_malformed_record_is_an_engine_record_error(tmp_path: Path, text: str, problem: str) -> None:
    (tmp_path / RECORD_NAME).write_text(text, encoding="latin-1")
    with pytest.raises(EngineRecordError, match=problem) as err:
        read_record(tmp_path)
    assert str(tmp_path) in str(err.value)


def test_find_engines_skips_malformed_records(tmp_path: Path) -> None:
    broken = tmp_path / "engines" / "fp16-b8-k3-bad"
    broken.mkdir(parents=True)
    (broken / RECORD_NAME).write_text("[]")
    good = _store(tmp_path, "fp16-b4-k3-good", record(request={"max_batch": 4, "beam": 3}))
    assert find_engines(tmp_path, "fp16", ENV, SHAS)[0] == good
    (good / RECORD_NAME).write_text(json.dumps(record(format_version="x")))
    with pytest.raises(EngineMismatchError, match="format_version 'x' is not an integer.*not an object"):
        find_engines(tmp_path, "fp16", ENV, SHAS)


def test_find_engines_serves_the_decode_beam(tmp_path: Path) -> None:
    wide = _store(tmp_path, "fp16-b64-k1-w", record(request={"max_batch": 64, "beam": 1}))
    beam3 = _store(tmp_path, "fp16-b16-k3-x", record(request={"max_batch": 16, "beam": 3}))
    beam5 = _store(tmp_path, "fp16-b32-k5-y", record(request={"max_batch": 32, "beam": 5}))
    assert find_engines(tmp_path, "fp16", ENV, SHAS, beam=3)[0] == beam3  # not b64-k1, whose beam is too narrow
    assert find_engines(tmp_path, "fp16", ENV, SHAS, beam=1)[0] == wide  # the smallest beam that serves, then batch
    assert [f for f, _ in fitting_engines(tmp_path, "fp16", ENV, SHAS, beam=2)] == [beam3, beam5]
    with pytest.raises(EngineMismatchError, match=r"built for beam 5, decoding asks for beam 6.*--beam 6`"):
        find_engines(tmp_path, "fp16", ENV, SHAS, beam=6)


# -- every file an engine set names resolves inside its folder and the bundle ------------------------------------------


def test_a_plan_symlinked_outside_the_bundle_is_refused(tmp_path: Path) -> None:
    """The plan's bytes match its recorded SHA-256, so only the path rule can catch it (it passed before)."""
    folder = _store(tmp_path / "bundle", "fp16-b8-k3-y", record())
    outside = tmp_path / "outside.plan"
    outside.write_bytes((folder / "step.plan").read_bytes())
    (folder / "step.plan").unlink()
    (folder / "step.plan").symlink_to(outside)
    with pytest.raises(EngineRecordError, match=r"'step.plan' resolves to .*outside the engine folder"):
        verify_plans(folder, read_record(folder))


def test_a_plan_with_dot_dot_is_refused_as_escaping(tmp_path: Path) -> None:
    folder = _store(tmp_path / "bundle", "fp16-b8-k3-y", record())
    data = read_record(folder)
    (folder.parent / "step.plan").write_bytes((folder / "step.plan").read_bytes())
    data["engines"]["step"]["plan"] = "../step.plan"
    with pytest.raises(
        EngineRecordError,
        match=r"'\.\./step\.plan' is not a relative path inside the engine folder "
        r"\(its '\.\.' escapes",
    ):
        verify_plans(folder, data)
    data["engines"]["step"]["plan"] = str(folder / "step.plan")
    with pytest.raises(EngineRecordError, match="not a relative path inside the engine folder"):
        verify_plans(folder, data)


def test_an_engine_folder_or_record_symlinked_outside_the_bundle_is_refused(tmp_path: Path) -> None:
    elsewhere = _store(tmp_path / "elsewhere", "fp16-b8-k3-y", record())
    bundle = tmp_path / "bundle"
    (bundle / "engines").mkdir(parents=True)
    (bundle / "engines" / "fp16-b8-k3-y").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(EngineRecordError, match="outside the bundle"):
        read_record(bundle / "engines" / "fp16-b8-k3-y")
    with pytest.raises(EngineMismatchError, match="outside the bundle"):
        find_engines(bundle, "fp16", ENV, SHAS)
    inside = _store(bundle, "fp16-b4-k3-z", record(request={"max_batch": 4, "beam": 3}))
    assert find_engines(bundle, "fp16", ENV, SHAS)[0] == inside  # the escaping set gives way to a sound one
    (inside / RECORD_NAME).unlink()
    (inside / RECORD_NAME).symlink_to(elsewhere / RECORD_NAME)
    with pytest.raises(EngineRecordError, match=r"'engine.json' resolves to .*outside the engine folder"):
        read_record(inside)


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"request": {"max_batch": 10**9, "beam": 3}}, "request.max_batch is 1000000000, above the limit"),
        ({"request": {"max_batch": 8, "beam": 10**6}}, "request.beam is 1000000, above the limit"),
        (
            {"engines": {"step": {"plan": "step.plan", "profile": {"dims": {"batch": [1, 8, 10**12]}}}}},
            r"engines\['step'\].profile.dims\['batch'\]",
        ),
        (
            {"engines": {"step": {"plan": "step.plan", "profile": {"dims": {"past": [30, 3, 0]}}}}},
            r"profile.dims\['past'\] \[30, 3, 0\] is not \(min, opt, max\)",
        ),
    ],
)
def test_unbounded_record_numbers_are_refused(tmp_path: Path, changes: dict, problem: str) -> None:
    (tmp_path / RECORD_NAME).write_text(json.dumps(record(**changes)))
    with pytest.raises(EngineRecordError, match=problem):
        read_record(tmp_path)


def test_a_record_with_an_unreadable_number_names_the_file(tmp_path: Path) -> None:
    (tmp_path / RECORD_NAME).write_text(json.dumps(record()).replace('"max_batch": 8', '"max_batch": ' + "9" * 5000))
    with pytest.raises(EngineRecordError, match=rf"{RECORD_NAME}: unreadable"):
        read_record(tmp_path)
    (tmp_path / RECORD_NAME).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(EngineRecordError, match=rf"{RECORD_NAME}: unreadable"):
        read_record(tmp_path)
