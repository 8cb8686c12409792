"""``benchmarks/side_by_side.py``: the plan of rows and interleaved cells, variant names, the weight-read limit's
pieces, the table, and one smoke run through fresh cell processes (tiny model, 1 round)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.scripts import load_script


@pytest.fixture(scope="module")
def script():  # type: ignore[no-untyped-def]
    return load_script("side_by_side")


def test_models_take_the_protocol_length_or_an_explicit_one(script) -> None:  # type: ignore[no-untyped-def]
    assert script.parse_model("acort-xsmall") == ("acort-xsmall", 26)
    assert script.parse_model("expansionnet-v2") == ("expansionnet-v2", 19)
    assert script.parse_model("ort-xsmall:12") == ("ort-xsmall", 12)
    with pytest.raises(argparse.ArgumentTypeError, match="STEPS"):
        script.parse_model("ort-xsmall")
    with pytest.raises(argparse.ArgumentTypeError, match=">= 2"):
        script.parse_model("ort-xsmall:1")


def test_variants_are_precisions_or_registered_int8_presets(script) -> None:  # type: ignore[no-untyped-def]
    assert script.parse_variant("fp32") == {"precision": "fp32"}
    assert script.parse_variant("fp16") == {"precision": "fp16"}
    assert script.parse_variant("int8") == {"precision": "int8", "preset": "cpu-auto"}
    assert script.parse_variant("int8:cpu-avx2") == {"precision": "int8", "preset": "cpu-avx2"}
    with pytest.raises(ValueError, match="unknown INT8 preset"):
        script.parse_variant("int8:no-such-preset")
    with pytest.raises(ValueError, match="unknown variant"):
        script.parse_variant("bf16")
    with pytest.raises(SystemExit):  # argparse reports it as a usage error
        script.parse_args(["--variants", "fp32,int4"])


def test_default_plan_is_every_acort_row_and_one_expansionnet_row(script) -> None:  # type: ignore[no-untyped-def]
    rows = script.plan_rows([("acort-xsmall", 26), ("expansionnet-v2", 19)])
    acort = [r for r in rows if r.model == "acort-xsmall"]
    assert {(r.threads, r.batch, r.beam) for r in acort} == {(t, b, k) for t in (1, 2) for b in (1, 16) for k in (1, 3)}
    assert [(r.threads, r.batch, r.beam, r.steps) for r in rows if r.model == "expansionnet-v2"] == [(1, 1, 3, 19)]
    full = script.plan_rows([("expansionnet-v2", 19)], full=True)
    assert len(full) == 8
    only = script.plan_rows([("acort-xsmall", 26), ("expansionnet-v2", 19)], batch=[16], threads=[1])
    assert {(r.batch, r.threads) for r in only} == {(16, 1)}
    assert rows[0].label == "acort-xsmall, greedy" and rows[-1].label == "expansionnet-v2, beam 3"
    with pytest.raises(ValueError, match=">= 1"):
        script.plan_rows([("acort-xsmall", 26)], batch=[0])


def test_rounds_run_every_cell_once_with_rotated_columns(script) -> None:  # type: ignore[no-untyped-def]
    rows = script.plan_rows([("acort-xsmall", 26)], threads=[1], beam=[3])
    columns = script.columns_for(["fp32", "int8"])
    assert columns == ["baseline", "torch", "ort-fp32", "ort-int8"]
    assert script.columns_for(["fp32"], baseline=False) == ["torch", "ort-fp32"]
    firsts = []
    for r in range(4):
        cells = script.round_cells(rows, columns, r)
        assert sorted(cells, key=str) == sorted(((row, c) for row in rows for c in columns), key=str)
        firsts.append(cells[0][1])
    assert firsts == columns  # each column leads one round


def _graph(tmp_path: Path) -> Path:
    """logits = (x @ W + cast(b) + E[ids] + T[ids]) @ T^T: W (4, 3) fp32 and b (3,) int8 are read whole, E (100, 3)
    only through a Gather (one row per id), T (5, 3) by a Gather and whole by a Gemm (tied weights); one initializer
    no node reads."""
    inits = {
        "W": np.ones((4, 3), np.float32),
        "b": np.ones(3, np.int8),
        "E": np.ones((100, 3), np.float32),
        "T": np.ones((5, 3), np.float32),
        "unused": np.ones(1000, np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["y"]),
        helper.make_node("Cast", ["b"], ["bf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["y", "bf"], ["yb"]),
        helper.make_node("Gather", ["E", "ids"], ["e"]),
        helper.make_node("Add", ["yb", "e"], ["ye"]),
        helper.make_node("Gather", ["T", "ids"], ["t"]),
        helper.make_node("Add", ["ye", "t"], ["z"]),
        helper.make_node("Gemm", ["z", "T"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 5])],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    path = tmp_path / "step.onnx"
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_step_weight_bytes_count_what_nodes_read_whole_at_stored_width(script, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert script.step_weight_bytes(_graph(tmp_path)) == 4 * 3 * 4 + 3 + 5 * 3 * 4


def test_step_weight_bytes_count_a_shared_weight_once_per_reading_node(script, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A layer shared by two positions is read twice per step: directly (W by two MatMuls) or through one
    DequantizeLinear whose output two MatMuls read (Q, int8, the QDQ form of a shared layer)."""
    inits = {
        "W": np.ones((3, 3), np.float32),
        "Q": np.ones((3, 3), np.int8),
        "s": np.ones((), np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h1"]),
        helper.make_node("MatMul", ["h1", "W"], ["h2"]),
        helper.make_node("DequantizeLinear", ["Q", "s"], ["qf"]),
        helper.make_node("MatMul", ["h2", "qf"], ["h3"]),
        helper.make_node("MatMul", ["h3", "qf"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    path = tmp_path / "shared.onnx"
    onnx.save(helper.make_model(graph), str(path))
    assert script.step_weight_bytes(path) == 2 * 9 * 4 + 2 * 9 + 4


def test_l3_size_from_sysfs(script, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    for index, (level, size) in enumerate([("1", "32K"), ("2", "1024K"), ("3", "32768K")]):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        (folder / "level").write_text(level + "\n")
        (folder / "size").write_text(size + "\n")
    assert script.l3_bytes(tmp_path) == 32 << 20
    assert script.l3_bytes(tmp_path / "absent") is None


def test_limit_uses_the_l3_rate_only_when_the_weights_fit(script) -> None:  # type: ignore[no-untyped-def]
    rates = {"l3_bytes": 32 << 20, "l3_GBps": 50.0, "dram_GBps": 10.0}
    small = script.weight_limit(10_000_000, rates)
    assert small["fits_l3"] and small["limit_s"] == pytest.approx(10_000_000 / 50e9)
    big = script.weight_limit(50_000_000, rates)
    assert not big["fits_l3"] and big["limit_s"] == pytest.approx(50_000_000 / 10e9)
    unknown = script.weight_limit(1000, {**rates, "l3_bytes": None})
    assert not unknown["fits_l3"]


def test_read_rate_is_positive(script) -> None:  # type: ignore[no-untyped-def]
    assert script.read_rate(1 << 20, repeats=3) > 0


def test_cells_aggregate_to_the_median_of_round_medians(script) -> None:  # type: ignore[no-untyped-def]
    cell = script.aggregate(
        [
            {"captions_per_s": 10.0, "tokens_sha1": "a"},
            {"captions_per_s": 12.0, "tokens_sha1": "a"},
            {"captions_per_s": 8.0, "tokens_sha1": "a"},
            {"error": "exit 1: boom"},
        ]
    )
    assert cell["captions_per_s"] == 10.0 and (cell["min"], cell["max"]) == (8.0, 12.0)
    assert cell["spread"] == pytest.approx(0.4) and cell["tokens_sha1"] == ["a"] and cell["errors"] == ["exit 1: boom"]
    assert script.aggregate([{"error": "x"}])["captions_per_s"] is None


def _report(script, same: bool = True):  # type: ignore[no-untyped-def]
    cells = {
        "baseline": script.aggregate([{"captions_per_s": 5.0, "tokens_sha1": "a"}] * 2),
        "torch": script.aggregate([{"captions_per_s": 10.0, "tokens_sha1": "a"}] * 2),
        "ort-fp32": script.aggregate([{"captions_per_s": 40.0, "tokens_sha1": "a" if same else "b"}] * 2),
        "ort-int8": script.aggregate([{"captions_per_s": 45.0, "tokens_sha1": "c"}] * 2),
    }
    manifest = {"variants": {"fp32": {"precision": "fp32"}, "int8": {"precision": "int8"}}}
    row = {"model": "acort-xsmall", "label": "acort-xsmall, beam 3", "batch": 1, "threads": 1, "cells": cells}
    row["same_tokens"] = script._same_tokens(cells, manifest)
    limit = {
        "memory": {"l3_bytes": 32 << 20, "l3_GBps": 50.0, "dram_GBps": 10.0},
        "steps": [
            {
                "model": "acort-xsmall",
                "variant": "fp32",
                "limit": script.weight_limit(5_000_000, {"l3_bytes": 32 << 20, "l3_GBps": 50.0, "dram_GBps": 10.0}),
                "timing": {
                    "1": {"rows": 1, "median_s": 2e-4, "kernel_floor": {"floor_s": 1.5e-4}},
                    "3": {"rows": 3, "median_s": 3e-4},
                },
            }
        ],
    }
    columns = list(cells)
    return {"columns": columns, "rows": [row], "rounds": 2, "warmup": 2, "repeats": 7, "limit": limit}


def test_markdown_shows_ratios_to_the_baseline_and_the_limit(script) -> None:  # type: ignore[no-untyped-def]
    text = script.markdown(_report(script))
    assert "re-run-prefix stand-in (no cache)" in text and "ratios vs the re-run-prefix stand-in" in text
    assert "| acort-xsmall, beam 3 | 1 | 1 | 5.00 | 10.0 (2.0×) | 40.0 (8.0×) | 45.0 (9.0×) |" in text
    assert "every edgecap FP32 column decoded the stand-in's tokens" in text  # INT8's other tokens are not a mismatch
    assert "| acort-xsmall | fp32 | 5.00 | yes | 100 | 200 (1) | 2.0× | 150 | 1.5× |" in text
    assert "| acort-xsmall | fp32 | 5.00 | yes | 100 | 300 (3) | 3.0× | – | – |" in text  # a report without a floor
    assert "Tokens differ between FP32 columns in: acort-xsmall, beam 3" in script.markdown(_report(script, False))


@pytest.mark.slow
def test_quick_run_measures_every_cell_in_fresh_processes(script, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out, work = tmp_path / "out", tmp_path / "work"
    code = script.main(["--quick", "--beam", "3", "--work", str(work), "--out", str(out)])
    report = json.loads((out / "side_by_side.json").read_text())
    assert code == 0, report["rows"]
    assert report["columns"] == ["baseline", "torch", "ort-fp32", "ort-int8"]
    (row,) = report["rows"]
    assert all(cell["captions_per_s"] > 0 for cell in row["cells"].values())
    assert row["same_tokens"]
    manifest = json.loads(next(work.glob("*/variants.json")).read_text())
    assert manifest["variants"]["int8"]["preset"] == "cpu-auto" and manifest["variants"]["int8"]["resolved_preset"]
    assert {s["variant"] for s in report["limit"]["steps"]} == {"fp32", "int8"}
    assert all(t["median_s"] > 0 for s in report["limit"]["steps"] for t in s["timing"].values())
    floors = [t["kernel_floor"] for s in report["limit"]["steps"] for t in s["timing"].values()]
    assert all(f["matmuls"] > 0 and f["floor_s"] > 0 and f["ratio_to_limit"] > 0 for f in floors)
    assert "| acort-test, beam 3 | 1 | 1 |" in (out / "side_by_side.md").read_text()
    assert report["ort_options"]["1"] == row["cells"]["ort-fp32"]["ort_options"] == script._ort_options(1, {})


def test_exported_stands_for_every_variant_in_the_export_folders(script) -> None:  # type: ignore[no-untyped-def]
    manifests = {
        "a": {"variants": {"fp32": {}, "int8": {}, "int8:cpu-avx2": {}}},
        "b": {"variants": {"fp32": {}, "fp16": {}}},
    }
    assert script.ort_variants(["fp32", "exported"], manifests) == ["fp32", "int8", "int8:cpu-avx2", "fp16"]
    assert script.ort_variants(["int8"], manifests) == ["int8"]
    assert script.parse_args(["--variants", "fp32,exported"]).variant_list == ["fp32", "exported"]


def test_limit_only_report_has_no_side_by_side_table(script) -> None:  # type: ignore[no-untyped-def]
    report = {**_report(script), "rows": []}
    text = script.markdown(report)
    assert "re-run-prefix stand-in" not in text and text.startswith("Weight-read limit")
    with pytest.raises(SystemExit):
        script.parse_args(["--limit-only", "--no-limit"])


@pytest.mark.parametrize("flag", ["--threads", "--batch", "--beam"])
def test_axis_values_below_one_are_refused(script, flag, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exc:
        script.parse_args([flag, "1", flag, "0"])
    assert exc.value.code == 2 and f"{flag} must be >= 1, got 0" in capsys.readouterr().err


def test_ort_cells_get_edgecaps_thread_plan_and_explicit_entries_win(script) -> None:  # type: ignore[no-untyped-def]
    """An ORT cell runs ``Captioner.load()``'s default on the row's core budget: one thread, and from 2 cores a batch
    split into that many concurrent chunks and a wide session of that many threads for other large calls; no
    spinning unless an ``--ort-config`` entry says so."""
    from edgecap.runtimes.threads import SPIN_KEYS, WIDE_FROM_ROWS, WidePlan

    single = script._ort_options(1, {})
    assert (single["intra_op_threads"], single["inter_op_threads"], single["wide"]) == (1, 1, None)
    options = script._ort_options(2, {})
    assert (options["intra_op_threads"], options["inter_op_threads"], options["execution_mode"]) == (1, 1, "sequential")
    assert options["session_config"] == dict.fromkeys(SPIN_KEYS, "0")  # as Captioner.load: no spinning
    assert options["wide"] == {"intra_op": 2, "spin": False, "from_rows": WIDE_FROM_ROWS}
    assert (single["decode_workers"], options["decode_workers"]) == (1, 2)  # from 2 cores a batch splits in two
    json.dumps(options)  # recorded in the report as it is
    wide = script._runtime_options(options)["wide"]
    assert isinstance(wide, WidePlan) and wide.intra_op == 2 and wide.threshold("step") == WIDE_FROM_ROWS["step"]
    chosen = script._ort_options(2, {SPIN_KEYS[0]: "1", "session.x": "y"})
    assert chosen["session_config"] == {SPIN_KEYS[0]: "1", SPIN_KEYS[1]: "0", "session.x": "y"}
