"""``report.schema.json``: it describes exactly the report dataclasses and ``BenchCfg``, the runtime's validator
judges reports as ``jsonschema`` does, and reports written before later fields were added still read."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

import pytest

from edgecap.bench.harness import LatencyStats
from edgecap.bench.memory import MemoryStats, PowerStats
from edgecap.bench.report import load_report
from edgecap.bench.results import (
    SCHEMA_PATH,
    SCHEMA_VERSION,
    BenchReport,
    Breakdown,
    BundleInfo,
    ComboResult,
    LoopInfo,
    Quality,
    SizeInfo,
    Skip,
    Throughput,
)
from edgecap.bench.run import BenchCfg, link_results
from edgecap.runtime.schema import load_schema
from tests.runtime.schema_check import disagreements, mutations

from .conftest import make_report, make_result

#: Each dataclass a report holds and its entry in the schema (None: the top level).
DEFINITIONS: dict[type, str | None] = {
    BenchReport: None,
    ComboResult: "result",
    BundleInfo: "bundle",
    Skip: "skip",
    LatencyStats: "latency",
    Throughput: "throughput",
    Breakdown: "breakdown",
    MemoryStats: "memory",
    PowerStats: "power",
    SizeInfo: "size",
    Quality: "quality",
    LoopInfo: "loop",
}


def _schema() -> typing.Mapping[str, typing.Any]:
    return load_schema(str(SCHEMA_PATH))


def _full_report() -> dict[str, typing.Any]:
    """A report using every optional part: power, quality, skips and errors, threads, fallback, length level."""
    results = [
        make_result("torch-rerun", times_ms=(40.0, 44.0, 42.0, 46.0), quality=1.10),
        make_result("onnxruntime", "int8", times_ms=(2.0, 3.0, 4.0, 5.0), quality=0.99),
    ]
    power = PowerStats(samples=3, total_mean_mw=4000.0, total_peak_mw=4500.0, rails_mean_mw={"VDD_IN": 4000.0})
    results[1] = dataclasses.replace(
        results[1],
        power=power,
        length_level=2,
        threads={"intra_op": 2, "inter_op": 1, "spin": None, "policy": "auto", "wide": None},
        provider_fallback={"requested": ["CUDAExecutionProvider"], "in_use": ["CPUExecutionProvider"], "cause": "x"},
    )
    report = dataclasses.replace(
        make_report(link_results(results)),
        skipped=[Skip("/b", "torch", "int8", "torch runs fp32/fp16")],
        errors=[Skip("/b", "onnxruntime", "fp16", "RuntimeError: boom", beam=3, batch=32)],
    )
    return json.loads(json.dumps(report.to_dict()))


@pytest.mark.parametrize("cls", list(DEFINITIONS), ids=lambda c: c.__name__)
def test_the_schema_describes_each_dataclass_field_by_field(cls: type) -> None:
    schema = _schema()
    part = schema if DEFINITIONS[cls] is None else schema["$defs"][DEFINITIONS[cls]]
    fields = dataclasses.fields(cls)
    assert list(part["properties"]) == [f.name for f in fields]
    required = [f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    assert part["required"] == required
    hints = typing.get_type_hints(cls)
    for f in fields:  # an optional field accepts null, a required one does not
        accepts_null = "null" in json.dumps(part["properties"][f.name])
        assert accepts_null == (type(None) in typing.get_args(hints[f.name])), f"{cls.__name__}.{f.name}"


def test_the_config_section_lists_every_benchcfg_field() -> None:
    documented = _schema()["$defs"]["config"]["properties"]
    assert sorted(documented) == sorted(f.name for f in dataclasses.fields(BenchCfg))
    assert f"schema version {SCHEMA_VERSION}" in _schema()["title"]


def test_the_schema_accepts_what_the_benchmark_writes() -> None:
    full = _full_report()
    assert BenchReport.from_dict(full, "report.json").to_dict() == full
    config = BenchCfg(bundles=("/bundles/acort",), length_levels="all", threads="dedicated", spin=True).to_dict()
    written = dataclasses.replace(make_report([make_result()]), config=config).to_dict()
    assert BenchReport.from_dict(json.loads(json.dumps(written)), "report.json").config == written["config"]


def test_it_judges_reports_as_jsonschema_does() -> None:
    """Valid reports and 1,500 mutations of one (values of every JSON type, fields removed or added)."""
    full = _full_report()
    docs = [full, make_report([make_result()]).to_dict(), *mutations(full, limit=1500)]
    found = disagreements(docs, _schema())
    assert found == [], found[:3]
    rejected = sum(1 for d in docs if not _valid(d))
    assert rejected > 300  # the mutations do break the schema, so agreement is not trivially "accept all"


def _valid(doc: typing.Any) -> bool:
    try:
        BenchReport.from_dict(doc, "r")
    except ValueError:
        return False
    return True


def test_a_report_written_before_the_later_fields_still_reads(tmp_path: Path) -> None:
    """Reports from before ``length_level``, ``threads``, ``provider_fallback``, ``run``, ``gpu_process_unmeasured``,
    ``notes``/``command``, with the ``ort`` runtime name and ``ort_providers``."""
    data = _full_report()
    for result in data["results"]:
        for key in ("length_level", "threads", "provider_fallback"):
            result.pop(key)
        result["memory"].pop("gpu_process_unmeasured")
        result["breakdown"].pop("preprocess_ms_per_image")
    data["results"][1]["runtime"] = "ort"
    data["environment"]["ort_providers"] = ["CPUExecutionProvider"]
    for key in ("run", "quality_set", "quality_note"):
        data["bundles"][0].pop(key)
    for key in ("notes", "command", "skipped", "errors"):
        data.pop(key)
    (tmp_path / "report.json").write_text(json.dumps(data))
    report = load_report(tmp_path)
    assert report.results[1].runtime == "onnxruntime" and report.results[1].length_level is None
    assert report.notes == [] and report.bundles[0].run is None
