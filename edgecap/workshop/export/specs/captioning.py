"""The export spec of an autoregressive :class:`~edgecap.workshop.models.CaptionModel`, built from the model contract
only.

Graphs (optimum's encoder / decoder-with-past split, with the first step folded into the cached step by a
zero-length cache instead of a second decoder or an ``If`` node, which TensorRT rejects):

- ``encoder``: ``features`` (B, N, C) float32, ``boxes`` (B, N, 4) float32, ``feature_mask`` (B, N) bool ->
  ``memory`` (B, N, d). With a backbone: ``pixel_values`` (B, 3, S, S) -> ``memory`` (B, h·w, d), fixed S.
- ``start``: ``memory`` (+ ``feature_mask`` without a backbone) -> the initial state, one output per
  ``model.state_names`` entry (cross-attention keys/values, the memory bias, empty self-attention caches).
- ``init``: ``encoder`` and ``start`` composed into one graph (built from the two exported graphs, not traced again).
  Runtimes load this one: one session call per batch, and the memory never leaves the device.
- ``step``: ``tokens`` (B,) int64 + the state (``state_names`` order) -> ``logprobs`` (B, V) + ``<state>_out`` for
  each state a step changes (the caches). States a step returns unchanged (cross-attention keys/values, the memory
  bias) are not outputs: the runtime carries them, which saves a copy of them per step. The cache length ``past`` is
  dynamic from 0 (first step) to ``max_len - 1``. The model's ``image_state_names`` (the cross-attention keys/values
  and the memory bias of the ORT/ACORT and ExpansionNet families) have their own leading dimension ``images``: a
  runtime may pass them once per image for ``batch`` = images × beams hypotheses, each image's beams consecutive,
  or once per hypothesis (``images`` = ``batch``); the step then attends per image.

A length-controllable model (``model.length_levels``; LaBERT §3.1) adds one input, ``length_level`` (B,) int64, to
``start`` and ``init`` (and so to the decode inputs); the level embedding then rides in the state like the rest.

Every dummy input is produced by running the torch model on random visual inputs (a step's cache comes from real
steps on random tokens), so parity checks see realistic value ranges: −1e4 in the memory bias, normalised memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from edgecap.runtime.backends.base import IMAGE_DIM
from edgecap.workshop.export.spec import DimSpec, ExportSpec, Fp16Policy, GraphSpec, Tolerance

__all__ = [
    "EncoderGraph",
    "InitGraph",
    "PixelEncoderGraph",
    "StartGraph",
    "StepGraph",
    "captioning_spec",
    "random_boxes",
]

VISUAL_INPUTS = ("features", "boxes", "feature_mask")
PIXEL_INPUT = "pixel_values"
LEVEL_INPUT = "length_level"


# -- graph modules: positional tensors in, tuples out ----------------------------------------------------------------
class EncoderGraph(nn.Module):
    """``(features, boxes, feature_mask) -> (memory,)``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, features: torch.Tensor, boxes: torch.Tensor, feature_mask: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.model.encode_memory(features, boxes, feature_mask),)


class PixelEncoderGraph(nn.Module):
    """``(pixel_values,) -> (memory,)``: the backbone's grid (features + cell boxes) into the captioner's encoder."""

    def __init__(self, backbone: nn.Module, model: nn.Module) -> None:
        super().__init__()
        self.backbone, self.model = backbone, model

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor]:
        features, boxes = self.backbone(pixel_values)
        return (self.model.encode_memory(features, boxes, None),)


class StartGraph(nn.Module):
    """``(memory[, feature_mask][, length_level]) -> state`` in ``state_names`` order."""

    def __init__(self, model: nn.Module, with_mask: bool, with_level: bool = False) -> None:
        super().__init__()
        self.model, self.with_mask, self.with_level = model, with_mask, with_level

    def forward(self, memory: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
        mask = rest[0] if self.with_mask else None
        level = rest[-1] if self.with_level else None
        state = self.model.start(memory, mask, level) if self.with_level else self.model.start(memory, mask)
        return tuple(state[n] for n in self.model.state_names)


class InitGraph(nn.Module):
    """``encoder`` then ``start``: the torch reference of the composed ``init`` graph.

    ``mask_input`` is the position of ``feature_mask`` among the encoder inputs, forwarded to ``start`` too (None when
    the encoder takes pixels and every cell is valid).
    """

    def __init__(self, encoder: nn.Module, start: StartGraph, mask_input: int | None) -> None:
        super().__init__()
        self.encoder, self.start, self.mask_input = encoder, start, mask_input

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        extra: tuple[torch.Tensor, ...] = ()
        if self.start.with_level:  # length_level is the last input
            inputs, extra = inputs[:-1], inputs[-1:]
        (memory,) = self.encoder(*inputs)
        if self.mask_input is None:
            return self.start(memory, *extra)
        return self.start(memory, inputs[self.mask_input], *extra)


class StepGraph(nn.Module):
    """``(tokens, *state) -> (logprobs, *new_state[updated])``: only the states a step changes are outputs."""

    def __init__(self, model: nn.Module, updated: Sequence[str]) -> None:
        super().__init__()
        self.model = model
        self.updated = tuple(updated)

    def forward(self, tokens: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        names = self.model.state_names
        logprobs, new_state = self.model.step(tokens, dict(zip(names, state, strict=True)))
        return (logprobs, *(new_state[n] for n in self.updated))


# -- dummy inputs ----------------------------------------------------------------------------------------------------
def pixel_parity_sizes(sizes: Sequence[Mapping[str, int]], backbone: Any) -> tuple[dict[str, int], ...]:
    """Parity sizes for a spec whose encoder takes pixels: the backbone fixes the number of regions (its grid), so
    the ``regions`` dimension is dropped from every size; unchanged for a features-in spec (``backbone`` None)."""
    if backbone is None:
        return tuple(dict(s) for s in sizes)
    return tuple({k: v for k, v in s.items() if k != "regions"} for s in sizes)


def random_boxes(batch: int, regions: int, generator: torch.Generator) -> torch.Tensor:
    """Valid normalised ``(x1, y1, x2, y2)`` boxes (B, N, 4) with sizes in [0.05, 0.6]."""
    corner = torch.rand(batch, regions, 2, generator=generator) * 0.8
    size = 0.05 + torch.rand(batch, regions, 2, generator=generator) * 0.55
    return torch.cat((corner, (corner + size).clamp(max=1.0)), dim=-1)


def random_mask(batch: int, regions: int, generator: torch.Generator) -> torch.Tensor:
    """(B, N) bool, about 20 % padding, at least one valid region per row."""
    mask = torch.rand(batch, regions, generator=generator) > 0.2
    mask[torch.arange(batch), torch.randint(0, regions, (batch,), generator=generator)] = True
    return mask


class _Inputs:
    """Dummy-input functions for every graph; each runs the torch model where realistic values matter."""

    def __init__(self, model: nn.Module, backbone: nn.Module | None) -> None:
        self.model, self.backbone = model, backbone
        self.levels = getattr(model, "length_levels", None)
        self.image_states = image_state_names(model)

    def _level(self, batch: int, g: torch.Generator) -> dict[str, torch.Tensor]:
        if not self.levels:
            return {}
        return {LEVEL_INPUT: torch.randint(1, len(self.levels) + 1, (batch,), generator=g)}

    def init(self, sizes: Mapping[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        return {**self.visual(sizes, g), **self._level(sizes["batch"], g)}

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

    def _encode_state(self, visual: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.backbone is not None:
            features, boxes = self.backbone(visual[PIXEL_INPUT])
            return self.model.encode_memory(features, boxes, None), None
        mask = visual["feature_mask"]
        return self.model.encode_memory(visual["features"], visual["boxes"], mask), mask

    @torch.no_grad()
    def start(self, sizes: Mapping[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        memory, mask = self._encode_state(self.visual(sizes, g))
        out = {"memory": memory} if mask is None else {"memory": memory, "feature_mask": mask}
        return {**out, **self._level(memory.shape[0], g)}

    @torch.no_grad()
    def step(self, sizes: Mapping[str, int], g: torch.Generator) -> dict[str, torch.Tensor]:
        """A step's feed after ``past`` steps on random tokens: ``images`` images with ``batch / images`` hypotheses
        each (every hypothesis its own tokens and cache), the image states once per image."""
        rows = sizes["batch"]
        images = sizes.get(IMAGE_DIM, rows) if self.image_states else rows
        if rows % images:  # e.g. an odd batch completed with the example image count: one image per hypothesis
            images = rows
        memory, mask = self._encode_state(self.visual({**sizes, "batch": images}, g))
        level = self._level(images, g)
        state = self.model.start(memory, mask, level[LEVEL_INPUT]) if level else self.model.start(memory, mask)
        per_row = {n: v.repeat_interleave(rows // images, 0) for n, v in state.items()}
        vocab = self.model.vocab_size
        for _ in range(sizes["past"]):
            _, per_row = self.model.step(torch.randint(0, vocab, (rows,), generator=g), per_row)
        tokens = torch.randint(0, vocab, (rows,), generator=g)
        feed = {n: (state[n] if n in self.image_states else per_row[n]).contiguous() for n in self.model.state_names}
        return {"tokens": tokens, **feed}


# -- the spec --------------------------------------------------------------------------------------------------------
def image_state_names(model: nn.Module) -> tuple[str, ...]:
    """The states the model's step also takes once per image (``model.image_state_names``; none if it has no such
    attribute); checked against ``state_names``."""
    names = tuple(getattr(model, "image_state_names", ()))
    unknown = [n for n in names if n not in model.state_names]
    if unknown:
        raise ValueError(f"image_state_names {unknown} are not state names {list(model.state_names)}")
    return names


def _probe_state(
    model: nn.Module, start: StartGraph, inputs: _Inputs, regions: DimSpec
) -> tuple[dict[str, dict[int, str]], tuple[str, ...]]:
    """Dynamic axes of each state tensor and the states a step updates, found by probing instead of declared per
    family: batch is axis 0 (the contract); an axis that one step grows is ``past``; an axis that changes with the
    region count is ``regions``; a state is *updated* unless ``step`` hands back the very tensor it was given."""
    probe_regions = (regions.example, regions.example + 1) if regions.is_dynamic else (regions.example,)
    states = []
    with torch.no_grad():
        for count in probe_regions:
            example = inputs.start({"batch": 2, "regions": count}, torch.Generator().manual_seed(0))
            states.append(dict(zip(model.state_names, start(*example.values()), strict=True)))
        _, after = model.step(torch.zeros(2, dtype=torch.long), dict(states[0]))
    axes: dict[str, dict[int, str]] = {}
    for name in model.state_names:
        entry = {0: "batch"}
        for axis in range(1, states[0][name].dim()):
            if after[name].shape[axis] != states[0][name].shape[axis]:
                entry[axis] = "past"
            elif any(s[name].shape[axis] != states[0][name].shape[axis] for s in states[1:]):
                entry[axis] = "regions"
        axes[name] = entry
    updated = tuple(n for n in model.state_names if after[n] is not states[0][n])
    return axes, updated


def _with_images(sizes: Mapping[str, int], image_states: Sequence[str]) -> dict[str, int]:
    """Parity sizes with ``images`` only where the model has image states, one per hypothesis unless given."""
    out = {k: v for k, v in sizes.items() if k != IMAGE_DIM}
    if image_states and "batch" in out:
        out[IMAGE_DIM] = int(sizes.get(IMAGE_DIM, out["batch"]))
    return out


def captioning_spec(
    model: nn.Module,
    *,
    tolerances: Mapping[str, Tolerance],
    graph_tolerances: Mapping[str, Mapping[str, Tolerance]] | None = None,
    output_tolerances: Mapping[str, Mapping[str, Mapping[str, Tolerance]]] | None = None,
    fp16: Mapping[str, Fp16Policy] | None = None,
    backbone: nn.Module | None = None,
    name: str | None = None,
    max_batch: int = 1024,
    max_regions: int = 1024,
    parity_sizes: Sequence[Mapping[str, int]] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> ExportSpec:
    """Export spec of an autoregressive captioner (see the module docstring for the graphs).

    Args:
        model: a ``CaptionModel`` (``encode_memory``, ``start``, ``step``, ``state_names``, ``max_len``,
            ``vocab_size``, ``feature_dim``); put in eval mode by export.
        tolerances: precision -> default tolerance of every graph output.
        graph_tolerances: graph -> precision -> tolerance, replacing ``tolerances`` for that graph.
        output_tolerances: graph -> precision -> output -> tolerance overrides.
        fp16: graph -> :class:`Fp16Policy`; graphs not named use an empty policy.
        backbone: an image backbone (``edgecap.workshop.models.backbone.Backbone``) to put in front of the encoder.
        name: model name for the graphs' metadata.
        max_batch, max_regions: upper bounds of the dynamic batch (images × beams) and region axes.
        parity_sizes: size combinations parity checks run; the default covers batch 1 and >1, cache length 0, 1 and
            the maximum, and region counts on both sides of the export example.
        metadata: extra metadata for every graph.
    """
    graph_tolerances = graph_tolerances or {}
    output_tolerances = output_tolerances or {}
    fp16 = fp16 or {}
    inputs = _Inputs(model, backbone)
    max_past = int(model.max_len) - 1
    if max_past < 2:
        raise ValueError(f"model max_len={model.max_len} is too short to export a cached step (need >= 3)")
    image_states = inputs.image_states
    dims: dict[str, DimSpec] = {
        # with image states the step traces 2 images × 2 hypotheses: distinct sizes keep the two dimensions apart
        "batch": DimSpec("batch", 1, max_batch, 4 if image_states else 2),
        "past": DimSpec("past", 0, max_past, min(3, max_past)),
    }
    if image_states:
        dims[IMAGE_DIM] = DimSpec(IMAGE_DIM, 1, max_batch, 2)
    if backbone is None:
        dims["regions"] = DimSpec("regions", 1, max_regions, 5)
        encoder_module: nn.Module = EncoderGraph(model)
        encoder_inputs: tuple[str, ...] = VISUAL_INPUTS
        encoder_axes = {"features": {0: "batch", 1: "regions"}, "boxes": {0: "batch", 1: "regions"}}
        encoder_axes["feature_mask"] = {0: "batch", 1: "regions"}
        memory_axes = {0: "batch", 1: "regions"}
    else:
        cells = int(backbone.num_cells)
        dims["regions"] = DimSpec("regions", cells, cells, cells)
        encoder_module = PixelEncoderGraph(backbone, model)
        encoder_inputs = (PIXEL_INPUT,)
        encoder_axes = {PIXEL_INPUT: {0: "batch"}}
        memory_axes = {0: "batch"}

    with_level = bool(getattr(model, "length_levels", None))
    level_inputs = (LEVEL_INPUT,) if with_level else ()
    level_axes = {LEVEL_INPUT: {0: "batch"}} if with_level else {}
    start_module = StartGraph(model, with_mask=backbone is None, with_level=with_level)
    start_inputs = (*(("memory", "feature_mask") if backbone is None else ("memory",)), *level_inputs)
    state_axes, updated = _probe_state(model, start_module, inputs, dims["regions"])
    start_state_axes = {n: {a: d for a, d in axes.items() if d != "past"} for n, axes in state_axes.items()}
    step_state_axes = {n: ({**axes, 0: IMAGE_DIM} if n in image_states else axes) for n, axes in state_axes.items()}
    names = tuple(model.state_names)
    out_names = tuple(f"{n}_out" for n in updated)

    def graph(
        graph_name: str,
        module: nn.Module,
        graph_inputs: Sequence[str],
        outputs: Sequence[str],
        axes: Mapping[str, Mapping[int, str]],
        maker: Any,
        description: str,
        compose: tuple[str, ...] = (),
    ) -> GraphSpec:
        return GraphSpec(
            name=graph_name,
            module=module,
            inputs=tuple(graph_inputs),
            outputs=tuple(outputs),
            dynamic_axes=axes,
            make_inputs=maker,
            tolerances={**tolerances, **graph_tolerances.get(graph_name, {})},
            output_tolerances=output_tolerances.get(graph_name, {}),
            compose=compose,
            fp16=fp16.get(graph_name, Fp16Policy()),
            description=description,
        )

    mask_axes = {"feature_mask": {0: "batch", 1: "regions"}} if backbone is None else {}
    graphs = (
        graph(
            "encoder",
            encoder_module,
            encoder_inputs,
            ("memory",),
            {**encoder_axes, "memory": memory_axes},
            inputs.visual,
            "visual inputs -> encoder memory",
        ),
        graph(
            "start",
            start_module,
            start_inputs,
            names,
            {"memory": memory_axes, **mask_axes, **level_axes, **start_state_axes},
            inputs.start,
            "memory -> initial decoder state (cross-attention keys/values, memory bias, empty caches)",
        ),
        graph(
            "init",
            InitGraph(encoder_module, start_module, 2 if backbone is None else None),
            (*encoder_inputs, *level_inputs),
            names,
            {**encoder_axes, **level_axes, **start_state_axes},
            inputs.init,
            "encoder + start in one graph (what runtimes load)",
            compose=("encoder", "start"),
        ),
        graph(
            "step",
            StepGraph(model, updated),
            ("tokens", *names),
            ("logprobs", *out_names),
            {"tokens": {0: "batch"}, **step_state_axes, "logprobs": {0: "batch"}},
            inputs.step,
            "one token per hypothesis with an explicit cache (length 0 at the first step)",
        ),
    )
    if parity_sizes is None:  # image states: once per hypothesis, 1 image × 3 beams, 2 images × 3 beams
        parity_sizes = (
            {"batch": 1, "regions": 7, "past": 0, IMAGE_DIM: 1},
            {"batch": 3, "regions": 4, "past": 1, IMAGE_DIM: 1},
            {"batch": 6, "regions": 9, "past": max_past, IMAGE_DIM: 2},
            {"batch": 3, "regions": 5, "past": 2, IMAGE_DIM: 3},
        )
    parity_sizes = pixel_parity_sizes(parity_sizes, backbone)
    parity_sizes = tuple(_with_images(s, image_states) for s in parity_sizes)
    meta = {
        "state_names": ",".join(names),
        "updated_state_names": ",".join(updated),
        "max_len": str(model.max_len),
        "vocab_size": str(model.vocab_size),
    }
    if backbone is not None:
        meta["backbone"] = str(getattr(backbone, "name", type(backbone).__name__))
        meta["image_size"] = str(backbone.image_size)
    meta.update({k: str(v) for k, v in (metadata or {}).items()})
    return ExportSpec(
        name=name or str(getattr(model.cfg, "family", type(model).__name__)),
        graphs=graphs,
        dims=dims,
        parity_sizes=tuple(dict(s) for s in parity_sizes),
        runtime_graphs={"encoder": "init", "step": "step"},
        state_names=names,
        updated_state_names=updated,
        decode_inputs=(*encoder_inputs, *level_inputs),
        length_levels=tuple(tuple(p) for p in model.length_levels) if with_level else (),
        metadata=meta,
    )
