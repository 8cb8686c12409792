"""Export spec of LaBERT (``edgecap.workshop.models.labert``): two graphs that mask-predict drives through a runtime.

- ``encoder``: ``features`` (B, N, C) float32, ``boxes`` (B, N, 4) float32, ``feature_mask`` (B, N) bool ->
  ``visual`` (B, N, d) embedded visual tokens (Eq. 3) and ``visual_bias`` (B, N) key-padding bias. With a backbone:
  ``pixel_values`` (B, 3, S, S) -> the same two outputs over the backbone's grid cells (N = h·w fixed, all valid), so
  a bundle captions pixels in one runtime exactly like the autoregressive families.
- ``refine``: ``tokens`` (B, L) int64 (``[MASK]`` = ``vocab_size``), ``length_level`` (B,) int64 in 1..k, ``visual``,
  ``visual_bias`` -> ``logprobs`` (B, L, V). ``L`` is dynamic (1..the last level's ``L_high``), so one graph serves
  every level; a TensorRT build can pin one profile per level.

The length levels, default T and γ per level and the mask id are written into every graph's metadata
(:func:`~edgecap.workshop.torch_runtime.refine.refine_metadata`), so a runtime needs only the two files. Float16 keeps
LayerNorm, softmax and GELU's ``Erf`` in float32 (the −1e4 padding bias and BERT's post-LN residual stream); the
tolerances are element-wise bounds from measured errors with a margin.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from edgecap.workshop.export.spec import DimSpec, ExportSpec, Fp16Policy, GraphSpec, Tolerance
from edgecap.workshop.export.specs.captioning import (
    PIXEL_INPUT,
    VISUAL_INPUTS,
    pixel_parity_sizes,
    random_boxes,
    random_mask,
)
from edgecap.workshop.torch_runtime.refine import refine_metadata

__all__ = ["LABERT_FP16", "LABERT_TOLERANCES", "labert_export_spec"]

_KEEP_FP32 = ("LayerNormalization", "ReduceMean", "Softmax", "LogSoftmax", "Erf", "Pow", "Sqrt", "Div")
LABERT_FP16 = Fp16Policy(op_types=_KEEP_FP32)
LABERT_TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(atol=1e-4, rtol=1e-4),
    "fp16": Tolerance(atol=5e-2, rtol=2e-2),
}


class LaBertEncoderGraph(nn.Module):
    """``(features, boxes, feature_mask) -> (visual, visual_bias)``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, features: torch.Tensor, boxes: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        state = self.model.encode(features, boxes, mask)
        return state["visual"], state["visual_bias"]


class LaBertPixelEncoderGraph(nn.Module):
    """``(pixel_values,) -> (visual, visual_bias)``: the backbone's grid (features + cell boxes, every cell valid)
    into LaBERT's visual embedding."""

    def __init__(self, backbone: nn.Module, model: nn.Module) -> None:
        super().__init__()
        self.backbone, self.model = backbone, model

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        features, boxes = self.backbone(pixel_values)
        state = self.model.encode(features, boxes, None)
        return state["visual"], state["visual_bias"]


class LaBertRefineGraph(nn.Module):
    """``(tokens, length_level, visual, visual_bias) -> (logprobs,)``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, tokens: torch.Tensor, length_level: torch.Tensor, visual: torch.Tensor, visual_bias: torch.Tensor
    ) -> tuple[torch.Tensor]:
        return (self.model.refine(tokens, length_level, {"visual": visual, "visual_bias": visual_bias}),)


class _Inputs:
    def __init__(self, model: nn.Module, backbone: nn.Module | None) -> None:
        self.model, self.backbone = model, backbone

    def visual(self, sizes: Mapping[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        batch = sizes["batch"]
        if self.backbone is not None:
            side = self.backbone.image_size
            return {PIXEL_INPUT: torch.randn(batch, 3, side, side, generator=g)}
        regions = sizes["regions"]
        return {
            "features": torch.randn(batch, regions, self.model.feature_dim, generator=g),
            "boxes": random_boxes(batch, regions, g),
            "feature_mask": random_mask(batch, regions, g),
        }

    @torch.no_grad()
    def refine(self, sizes: Mapping[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        visual = self.visual(sizes, g)
        if self.backbone is not None:
            state = self.model.encode(*self.backbone(visual[PIXEL_INPUT]), None)
        else:
            state = self.model.encode(visual["features"], visual["boxes"], visual["feature_mask"])
        batch, length = sizes["batch"], sizes["length"]
        tokens = torch.randint(0, self.model.vocab_size + 1, (batch, length), generator=g)  # includes [MASK]
        levels = torch.randint(1, len(self.model.levels) + 1, (batch,), generator=g)
        return {"tokens": tokens, "length_level": levels, **{n: state[n].contiguous() for n in self.model.state_names}}


def labert_export_spec(
    model: nn.Module,
    *,
    backbone: nn.Module | None = None,
    name: str | None = None,
    max_batch: int = 1024,
    max_regions: int = 1024,
    metadata: Mapping[str, Any] | None = None,
) -> ExportSpec:
    """The spec of a ``LaBertCaptioner`` (see the module docstring); ``backbone`` puts an image backbone
    (``edgecap.workshop.models.backbone.Backbone``) in front of the encoder."""
    inputs = _Inputs(model, backbone)
    max_len = int(model.max_len)
    if backbone is None:
        regions = DimSpec("regions", 1, max_regions, 5)
        encoder_module: nn.Module = LaBertEncoderGraph(model)
        encoder_inputs: tuple[str, ...] = VISUAL_INPUTS
        region_axes = {0: "batch", 1: "regions"}
        encoder_axes = {n: region_axes for n in VISUAL_INPUTS}
    else:
        cells = int(backbone.num_cells)
        regions = DimSpec("regions", cells, cells, cells)
        encoder_module = LaBertPixelEncoderGraph(backbone, model)
        encoder_inputs = (PIXEL_INPUT,)
        region_axes = {0: "batch"}
        encoder_axes = {PIXEL_INPUT: {0: "batch"}}
    dims = {
        "batch": DimSpec("batch", 1, max_batch, 2),
        "regions": regions,
        "length": DimSpec("length", 1, max_len, min(3, max_len)),
    }
    names = tuple(model.state_names)
    state_axes = {"visual": region_axes, "visual_bias": region_axes}
    common = {"tolerances": LABERT_TOLERANCES, "fp16": LABERT_FP16}
    graphs = (
        GraphSpec(
            name="encoder",
            module=encoder_module,
            inputs=encoder_inputs,
            outputs=names,
            dynamic_axes={**encoder_axes, **state_axes},
            make_inputs=inputs.visual,
            description="visual inputs -> embedded visual tokens (Eq. 3) and their padding bias",
            **common,
        ),
        GraphSpec(
            name="refine",
            module=LaBertRefineGraph(model),
            inputs=("tokens", "length_level", *names),
            outputs=("logprobs",),
            dynamic_axes={
                "tokens": {0: "batch", 1: "length"},
                "length_level": {0: "batch"},
                **state_axes,
                "logprobs": {0: "batch", 1: "length"},
            },
            make_inputs=inputs.refine,
            description="one mask-predict pass: caption tokens at a length level -> log-probs at every position",
            **common,
        ),
    )
    meta = {
        "state_names": ",".join(names),
        "max_len": str(max_len),
        "vocab_size": str(model.vocab_size),
        **refine_metadata(model),
    }
    if backbone is not None:
        meta["backbone"] = str(getattr(backbone, "name", type(backbone).__name__))
        meta["image_size"] = str(backbone.image_size)
    meta.update({k: str(v) for k, v in (metadata or {}).items()})
    parity_sizes: tuple[dict[str, int], ...] = (
        {"batch": 1, "regions": 7, "length": 9},
        {"batch": 3, "regions": 4, "length": 1},
        {"batch": 4, "regions": 9, "length": max_len},
    )
    parity_sizes = pixel_parity_sizes(parity_sizes, backbone)
    return ExportSpec(
        name=name or "labert",
        graphs=graphs,
        dims=dims,
        parity_sizes=parity_sizes,
        runtime_graphs={"encoder": "encoder", "refine": "refine"},
        state_names=names,
        decode_inputs=encoder_inputs,
        decoding="mask_predict",
        length_levels=tuple(tuple(p) for p in model.levels),
        decode_defaults={"refine_steps": list(model.cfg.refine_steps), "eos_decay": list(model.cfg.eos_decay)},
        metadata=meta,
    )
