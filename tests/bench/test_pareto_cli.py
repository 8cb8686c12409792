"""``edgecap bench`` over several bundles of one model (a baseline and a compressed copy): the report names each
variant's recipe, reads the manifests' CIDEr-D and writes the compression chart; an old bundle without any of those
records still benchmarks. Nothing here checks speed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from edgecap.bench.report import load_report
from edgecap.cli.bench import bench

FAST = ["--warmup", "1", "--min-repeats", "2", "--min-seconds", "0", "--threads", "1", "--quiet", "--no-isolate"]


def _copy(bundle: Path, to: Path, cider: float, compression: dict[str, Any] | None) -> Path:
    """A copy of ``bundle`` whose manifest records a held-out check of its FP32 variant (and ``compression``)."""
    shutil.copytree(bundle, to)
    manifest_path = to / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["variants"]["fp32"]["quality"] = {
        "set": "val split of tiny data (4 images)",
        "images": 4,
        "reference_cider_d": cider,
        "candidate_cider_d": cider,
        "cider_d_delta": 0.0,
        "agreement": 1.0,
    }
    if compression is not None:
        manifest["compression"] = compression
    manifest_path.write_text(json.dumps(manifest))
    return to


def _bench(bundles: list[Path], out: Path) -> Any:
    args = [a for b in bundles for a in ("--bundle", str(b))]
    args += ["--runtime", "onnxruntime", "--batch", "1", "--beam", "1", "--synthetic", "2", "--no-quality"]
    return CliRunner().invoke(bench, [*args, "--out", str(out), *FAST])


def test_bench_over_compressed_bundles_names_recipes_and_draws_the_chart(tiny_bundle: Path, tmp_path: Path) -> None:
    base = _copy(tiny_bundle, tmp_path / "base", 0.50, None)
    kd = {"steps": [{"kind": "distillation"}, {"kind": "pruning"}], "recipe": "distillation+pruning"}
    pruned = _copy(tiny_bundle, tmp_path / "pruned", 0.55, kd)
    out = tmp_path / "report"
    result = _bench([base, pruned], out)
    assert result.exit_code == 0, result.output
    report = load_report(out)
    assert [(b.recipe, b.variant_recipes) for b in report.bundles] == [
        (None, {"fp32": "baseline"}),
        ("distillation+pruning", {"fp32": "distillation+pruning"}),
    ]
    markdown = (out / "report.md").read_text()
    assert "| base | fp32 | baseline |" in markdown and "| 50.0 |" in markdown
    assert "| pruned | fp32 | distillation+pruning |" in markdown and "| 55.0 |" in markdown
    assert "onnxruntime, b1" in markdown and "CIDEr-D measured on: base: val split of tiny data (4 images)" in markdown
    assert (out / "compression_pareto.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_over_an_old_bundle_has_no_compression_section(tiny_bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = _bench([tiny_bundle], out)
    assert result.exit_code == 0, result.output
    report = load_report(out)
    assert report.bundles[0].recipe is None and report.bundles[0].variant_recipes == {"fp32": "baseline"}
    assert not (out / "compression_pareto.png").exists()
    assert "Compression variants" not in (out / "report.md").read_text()
