"""The device buffers a decoding run needs for one batch shape: allocated once, reused for every call.

Autoregressive bundles (``init`` + ``step`` engines):

- the encoder inputs, one row per image;
- every decoder state twice (ping-pong): the step engine reads the state from one copy and writes the next step's
  state into the other, and the reorder engine gathers beams from one copy into the other, so caches never leave
  the device. A state is sized for its largest shape: ``batch × beam`` rows and, for a growing cache, the longest
  cache the step writes (``past`` at its maximum + 1). A smaller shape uses the start of the buffer (TensorRT tensors
  are dense, so a (rows, ..., past, ...) tensor is the buffer's first bytes);
- the tokens, the log-probs the search reads back each step, and the reorder index.

LaBERT bundles (``encoder`` + ``refine``): the encoder inputs, the state once (refinement never reorders rows), the
tokens and length levels, and the (rows, length, vocabulary) log-probs of a pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from edgecap.runtime.backends.base import IMAGE_DIM, TensorMeta
from edgecap.runtime.engines.graphs import GraphIO
from edgecap.runtime.engines.profiles import ROW_DIM, eval_dim

__all__ = ["INDEX_NAME", "BufferPlan", "BufferSpec", "plan_buffers"]

#: The reorder engine's row-index input.
INDEX_NAME = "index"
#: The reorder engine's index dtype (TensorRT's gather takes int32 or int64 indices).
INDEX_DTYPE = "int32"


@dataclass(frozen=True)
class BufferSpec:
    """One device buffer: what it holds, its largest shape and dtype, and how many copies (2 = ping-pong)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    copies: int = 1

    @property
    def nbytes(self) -> int:
        """Bytes of one copy."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def total_bytes(self) -> int:
        return self.nbytes * self.copies


@dataclass(frozen=True)
class BufferPlan:
    """The buffers of one batch shape (images × beam) and their total size."""

    images: int
    beam: int
    buffers: tuple[BufferSpec, ...]

    @property
    def total_bytes(self) -> int:
        return sum(b.total_bytes for b in self.buffers)

    def __getitem__(self, name: str) -> BufferSpec:
        for spec in self.buffers:
            if spec.name == name:
                return spec
        raise KeyError(f"no buffer {name!r} in the plan ({[b.name for b in self.buffers]})")

    def rows(self) -> list[dict[str, object]]:
        """One JSON-ready row per buffer, for reports."""
        return [
            {"name": b.name, "shape": list(b.shape), "dtype": b.dtype, "copies": b.copies, "bytes": b.total_bytes}
            for b in self.buffers
        ]


def _at(spec: TensorMeta, sizes: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(eval_dim(d, sizes) for d in spec.shape)


def plan_buffers(
    encoder: GraphIO,
    loop: GraphIO,
    loop_role: str,
    state_names: Sequence[str],
    dims: Mapping[str, int],
    images: int,
    beam: int,
    *,
    logprobs_name: str = "logprobs",
) -> BufferPlan:
    """The device buffers of one batch shape.

    Args:
        encoder: the encoder (``init``) graph's I/O.
        loop: the ``step`` or ``refine`` graph's I/O.
        loop_role: ``"step"`` or ``"refine"``.
        state_names: the decoder state, in the loop graph's order.
        dims: every dimension at its maximum (``EngineProfile.max_sizes`` of the loop graph), ``batch`` excluded.
        images: images per call.
        beam: beam width (1 for greedy decoding and for ``refine``).
        logprobs_name: the loop graph's log-prob output.
    """
    per_hypothesis = loop_role == "step"
    rows = images * (beam if per_hypothesis else 1)
    image_sizes = {**dims, ROW_DIM: images}
    row_sizes = {**dims, ROW_DIM: rows, IMAGE_DIM: rows}  # image states: one row per hypothesis here
    if per_hypothesis and "past" in dims:
        row_sizes["past"] = dims["past"] + 1  # the step writes one more position than it reads
    buffers = [BufferSpec(s.name, _at(s, image_sizes), s.dtype) for s in encoder.inputs]
    copies = 2 if per_hypothesis else 1
    for name in state_names:
        buffers.append(BufferSpec(name, _at(loop.input(name), row_sizes), loop.input(name).dtype, copies))
    state_set = set(state_names)
    for spec in loop.inputs:
        if spec.name not in state_set:
            buffers.append(BufferSpec(spec.name, _at(spec, row_sizes), spec.dtype))
    out = next((s for s in loop.outputs if s.name == logprobs_name), None)
    if out is None:
        raise KeyError(f"the {loop_role} graph has no output {logprobs_name!r}")
    buffers.append(BufferSpec(logprobs_name, _at(out, row_sizes), out.dtype))
    if per_hypothesis:
        buffers.append(BufferSpec(INDEX_NAME, (rows,), INDEX_DTYPE))
    return BufferPlan(images, beam, tuple(buffers))
