"""Tiny runs and bundles shared by the bundle, captioner and CLI tests.

Exporting even a tiny model costs tens of seconds on a 2-core machine (the dynamo exporter), so each kind of bundle
is built once per test session and memoised here; tests that alter a bundle work on a copy (:func:`copy_bundle`).

- :func:`region_run`: ``ort-test`` trained for a few steps on ``tiny_data``'s region features (no backbone), so its
  dataset's val split gives the held-out set;
- :func:`region_bundle`: that run exported with FP32 + FP16 + INT8 (calibrated on the dataset's train split);
- :func:`pixel_run`: an untrained ``ort-test`` (or another tiny model) on a random ``test_efficientnet`` (64 px) whose
  weights are a file, i.e. a run whose features came from a backbone, so images can be captioned;
- :func:`pixel_bundle`: that run exported through the CLI with no input flag, i.e. pixels in by default;
- :func:`labert_bundle`: that run for ``labert-test`` exported through the CLI (pixels-in mask-predict bundle).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from edgecap.runtime.bundle.manifest import MANIFEST_NAME, hash_files

_CACHE: dict[str, Any] = {}


def _root(factory: pytest.TempPathFactory) -> Path:
    if "root" not in _CACHE:
        _CACHE["root"] = factory.mktemp("bundles")
    return _CACHE["root"]


def train_region_run(model: str, tiny_data: tuple[Path, Path], out: Path) -> Path:
    """``model`` trained for two epochs on ``tiny_data``'s region features: a real run with a held-out split."""
    from edgecap.workshop.training.config import TrainCfg
    from edgecap.workshop.training.loop import train

    data, feats = tiny_data
    cfg = TrainCfg(
        model=model,
        data=str(data),
        features=str(feats),
        out=str(out),
        epochs=2,
        batch_size=16,
        optimizer="adamw",
        lr=3e-3,
        warmup_steps=2,
        vocab_min_count=2,
        max_words=12,
        device="cpu",
        save_every_steps=0,
    )
    return train(cfg, progress=False)


def region_run(tiny_data: tuple[Path, Path], factory: pytest.TempPathFactory) -> Path:
    if "region_run" not in _CACHE:
        _CACHE["region_run"] = train_region_run("ort-test", tiny_data, _root(factory) / "region-run")
    return _CACHE["region_run"]


def region_bundle(tiny_data: tuple[Path, Path], factory: pytest.TempPathFactory) -> Path:
    """The region run exported with FP32, FP16 and INT8 (calibrated on the train split, quality on val)."""
    if "region_bundle" not in _CACHE:
        from edgecap.workshop.export.bundle import export_bundle

        data, _ = tiny_data
        run, out = region_run(tiny_data, factory), _root(factory) / "region-bundle"
        _CACHE["region_bundle"] = export_bundle(
            run, out, fp16=True, int8=True, calib=data, calib_size=8, progress=False
        )
    return _CACHE["region_bundle"]


def pixel_run(
    tiny_data: tuple[Path, Path],
    factory: pytest.TempPathFactory,
    model_name: str = "ort-test",
    overrides: dict[str, Any] | None = None,
    packaged: bool = False,
) -> tuple[Path, Path | None]:
    """(run directory, backbone weights file): an untrained ``model_name`` (with config ``overrides``) on a random
    64 px ``test_efficientnet`` whose weights are stored in a file, laid out exactly like a run ``edgecap train``
    writes. ``packaged``: on the offline packaged ``tf_efficientnet_lite0`` (ImageNet weights, 64 px, a 2×2 grid)
    instead, the default backbone's case, which needs no weights file (None is returned for it)."""
    overrides = dict(overrides or {})
    parts = [] if (model_name, overrides) == ("ort-test", {}) else [model_name, *map(str, overrides.values())]
    parts += ["lite0"] if packaged else []
    tag = "".join(f"-{p}" for p in parts)  # the plain ort-test run keeps its original paths
    key = f"pixel_run{tag}"
    if key not in _CACHE:
        from edgecap.runtime.vocab import build_vocab
        from edgecap.workshop.data.datasets import load_dataset
        from edgecap.workshop.models import create_model, get_model_cfg
        from edgecap.workshop.models.backbone import create_backbone
        from edgecap.workshop.training.checkpoint import save_weights, write_config

        data, _ = tiny_data
        root = _root(factory)
        run = root / f"pixel-run{tag}"
        run.mkdir(parents=True)
        torch.manual_seed(0)
        if packaged:
            weights = None
            backbone = create_backbone("tf_efficientnet_lite0", pretrained=True, image_size=64)
        else:
            weights = root / f"tiny-backbone{tag}.safetensors"
            save_file(create_backbone("test_efficientnet", pretrained=False, image_size=64).model.state_dict(), weights)
            backbone = create_backbone("test_efficientnet", weights=weights, image_size=64)
        captions = [c for r in load_dataset(data).split("train") for c in r.captions]
        cfg = get_model_cfg(model_name)  # the vocabulary the model takes: words, or ACORT's radix digits
        vocab = build_vocab(captions, kind=cfg.vocab_kind, min_count=2, radix_base=cfg.radix_base)
        vocab.save(run / "vocab.json")
        model = create_model(model_name, vocab_size=vocab.size, feature_dim=backbone.feature_dim, **overrides)
        save_weights(model, run / "weights.safetensors")
        write_config(
            run,
            {
                "model": {
                    "name": model_name,
                    "vocab_size": vocab.size,
                    "feature_dim": backbone.feature_dim,
                    "overrides": overrides,
                    "cfg": model.cfg.to_dict(),
                },
                "train": {"max_words": 8},
                "data": str(data),
                "features": None,
                "backbone": backbone.spec,
                "vocab": {"kind": vocab.kind, "size": vocab.size},
            },
        )
        _CACHE[key] = (run, weights)
    return _CACHE[key]


def pixel_bundle(tiny_data: tuple[Path, Path], factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(bundle, the command's output): the pixel run exported **through the CLI** without ``--with-backbone``, so
    the backbone lands in the graph by default (FP32 only): the ``edgecap export`` smoke test and a
    pixels-to-captions bundle in one export."""
    if "pixel_bundle" not in _CACHE:
        from edgecap.cli import main

        run, weights = pixel_run(tiny_data, factory)
        out = _root(factory) / "pixel-bundle"
        args = ["export", "--model", str(run), "--backbone-weights", str(weights), "--out", str(out)]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        _CACHE["pixel_bundle"] = (out, result.output)
    return _CACHE["pixel_bundle"]


def labert_bundle(tiny_data: tuple[Path, Path], factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(bundle, the command's output): an untrained ``labert-test`` pixel run exported **through the CLI** (FP32,
    pixels in by default, held-out check on the dataset's val split decoded by mask-predict)."""
    if "labert_bundle" not in _CACHE:
        from edgecap.cli import main

        run, weights = pixel_run(tiny_data, factory, "labert-test")
        out = _root(factory) / "labert-bundle"
        args = ["export", "--model", str(run), "--backbone-weights", str(weights), "--out", str(out), "--quiet"]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        _CACHE["labert_bundle"] = (out, result.output)
    return _CACHE["labert_bundle"]


def export_result_from(
    bundle: Path, model: Any, precisions: tuple[str, ...], backbone: Any = None, fail: str = "", name: str = "ort-test"
):
    """An ``ExportResult`` rebuilt from a bundle's graphs and parity numbers, standing in for ``export_onnx`` (which
    takes tens of seconds) in tests of what ``export_bundle`` does around it. ``fail`` names a graph whose FP32
    parity is reported as failed."""
    import onnx

    from edgecap.workshop.export import ExportedGraph, ExportResult, get_export_spec

    spec = get_export_spec(model.eval(), backbone=backbone, name=name)
    manifest = json.loads((bundle / MANIFEST_NAME).read_text())
    graphs = {}
    for precision in precisions:
        variant = manifest["variants"][precision]
        for graph, name in variant["graphs"].items():
            parity = json.loads(json.dumps(variant["parity"][graph]))
            if graph == fail and precision == "fp32":
                parity["passed"] = False
                first = next(iter(parity["outputs"].values()))
                first.update(passed=False, max_abs=0.5, violations=3)
            graphs[(graph, precision)] = ExportedGraph(graph, precision, onnx.load(str(bundle / name)), parity=parity)
    return ExportResult(spec, graphs)


def copy_bundle(bundle: Path, dest: Path) -> Path:
    """A private copy of a bundle for a test that alters it."""
    return Path(shutil.copytree(bundle, dest))


def rehash(bundle: Path) -> None:
    """Recompute the manifest's checksums, so that only the check under test can catch a tampered bundle."""
    manifest = json.loads((bundle / MANIFEST_NAME).read_text())
    manifest["files"] = hash_files(bundle)
    (bundle / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2))


def edit_json(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text())
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split("__")
        for key in parents:
            node = node[key]
        node[last] = value
    path.write_text(json.dumps(data, indent=2))
