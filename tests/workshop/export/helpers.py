"""Tiny registered test models and their exports, built once per test process (export costs seconds per graph).

Shared by ``tests/workshop/export`` and ``tests/runtime/backends/test_onnxruntime_session.py``; everything is
parametrised over
``list_models("*-test*")``, so a new family's test config is exported and checked without new test code.
"""

from __future__ import annotations

import functools

import torch

from edgecap.runtime.decoding import DecodeCfg, RadixSpec
from edgecap.workshop.export.onnx import ExportResult, export_onnx
from edgecap.workshop.models import create_model, get_model_cfg, list_models

TEST_CONFIGS = tuple(list_models("*-test*"))
FEATURE_DIM = 16
WORD_VOCAB = 20
RADIX_BASE = 10  # radix models need vocab_size = radix_base + 3
BACKBONE = "test_resnet"  # timm's own ~0.5 M-parameter test network
BACKBONE_SIZE = 64


@functools.cache
def tiny_model(name: str) -> torch.nn.Module:
    """The registered config with a tiny vocabulary and feature size, deterministic weights, eval mode."""
    torch.manual_seed(0)
    if get_model_cfg(name).vocab_kind == "radix":
        model = create_model(name, vocab_size=RADIX_BASE + 3, feature_dim=FEATURE_DIM, radix_base=RADIX_BASE)
    else:
        model = create_model(name, vocab_size=WORD_VOCAB, feature_dim=FEATURE_DIM)
    return model.eval()


def autoregressive_test_configs() -> tuple[str, ...]:
    """The test configs with a cached ``step`` (the ``CaptionModel`` contract); LaBERT's refine models are not."""
    from edgecap.workshop.models import CaptionModel

    return tuple(n for n in TEST_CONFIGS if isinstance(tiny_model(n), CaptionModel))


def graph_cases(runtime_only: bool = False) -> list[tuple[str, str]]:
    """``(config, graph)`` for every graph (or every runtime graph) of every test config's export spec."""
    from edgecap.workshop.export.spec import get_export_spec

    cases = []
    for name in TEST_CONFIGS:
        spec = get_export_spec(tiny_model(name), name=name)
        graphs = tuple(dict.fromkeys(spec.runtime_graphs.values())) if runtime_only else spec.graph_names
        cases.extend((name, g) for g in graphs)
    return cases


def decoder_graph(spec) -> str:
    """The per-token (or per-refinement) graph a runtime runs repeatedly: ``step`` or ``refine``."""
    return next(g for role, g in spec.runtime_graphs.items() if role != "encoder")


AR_TEST_CONFIGS = autoregressive_test_configs()


@functools.cache
def exported(name: str) -> ExportResult:
    """Every graph of ``name`` at fp32 and fp16, in memory, with export-time parity reports."""
    return export_onnx(tiny_model(name), name=name, precisions=("fp32", "fp16"))


@functools.cache
def backbone_model() -> tuple[torch.nn.Module, torch.nn.Module]:
    from edgecap.workshop.models.backbone import create_backbone

    torch.manual_seed(0)
    backbone = create_backbone(BACKBONE, pretrained=False, image_size=BACKBONE_SIZE).eval()
    model = create_model(
        "acort-test", vocab_size=RADIX_BASE + 3, feature_dim=backbone.feature_dim, radix_base=RADIX_BASE
    ).eval()
    return backbone, model


@functools.cache
def exported_with_backbone() -> ExportResult:
    """acort-test behind a random ``test_resnet``: ``pixel_values`` -> state (the ``init`` graph and its parts)."""
    backbone, model = backbone_model()
    return export_onnx(model, backbone=backbone, name="acort-test+backbone", graphs=["init"])


#: One test config per family: what pixels-in bundles are exported from (backbone + family encoder in one graph).
BACKBONE_FAMILIES = ("ort-test", "acort-test", "expansionnet-test", "labert-test", "image-transformer-test")


@functools.cache
def family_with_backbone(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(``test_resnet`` backbone, ``name`` on its features): the pair a pixels-in export of that family sees."""
    from edgecap.workshop.models.backbone import create_backbone

    torch.manual_seed(0)
    backbone = create_backbone(BACKBONE, pretrained=False, image_size=BACKBONE_SIZE).eval()
    if get_model_cfg(name).vocab_kind == "radix":
        model = create_model(name, vocab_size=RADIX_BASE + 3, feature_dim=backbone.feature_dim, radix_base=RADIX_BASE)
    else:
        model = create_model(name, vocab_size=WORD_VOCAB, feature_dim=backbone.feature_dim)
    return backbone, model.eval()


@functools.cache
def exported_family_with_backbone(name: str) -> ExportResult:
    """Every graph of ``name`` behind a random ``test_resnet`` at fp32 and fp16 (what ``edgecap export`` writes by
    default for a run on backbone features)."""
    backbone, model = family_with_backbone(name)
    return export_onnx(model, backbone=backbone, name=f"{name}+backbone", precisions=("fp32", "fp16"))


def decode_cfg(name: str, **overrides: object) -> DecodeCfg:
    """Beam-3 decoding with the token ids of the config's vocabulary kind (radix: constrained digits)."""
    if getattr(get_model_cfg(name), "length_levels", None):
        overrides = {"length_level": 2, **overrides}
    if get_model_cfg(name).vocab_kind == "radix":
        radix = RadixSpec(base=RADIX_BASE, digits=2, num_words=60)
        ids = {"pad_id": 0, "bos_id": RADIX_BASE + 1, "eos_id": RADIX_BASE + 2, "radix": radix}
    else:
        ids = {"pad_id": 0, "bos_id": 1, "eos_id": 2}
    return DecodeCfg(**{"strategy": "beam", "beam_size": 3, "max_len": 12, **ids, **overrides})


def random_images(count: int, regions: int = 7, seed: int = 7) -> dict[str, torch.Tensor]:
    """Random features/boxes/masks for ``count`` images (a fixture set in the spirit of precomputed features)."""
    from edgecap.workshop.export.specs.captioning import random_boxes, random_mask

    g = torch.Generator().manual_seed(seed)
    return {
        "features": torch.randn(count, regions, FEATURE_DIM, generator=g),
        "boxes": random_boxes(count, regions, g),
        "feature_mask": random_mask(count, regions, g),
    }
