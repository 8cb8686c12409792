"""2:4 semi-structured sparsity for TensorRT's sparse tensor cores (Ampere and later, Jetson Orin).

TensorRT's layout (Developer Guide, "Structured Sparsity"): in every group of four consecutive weights along the
reduction (K, input-channel) dimension at least two are zero. A ``Linear``'s weight is ``(out, in)`` and ``y = x Wᵀ``,
so the groups run along each row of the weight: the mask is torch.ao.pruning's ``WeightNormSparsifier`` with
``sparse_block_shape=(1, 4)`` and ``zeros_per_block=2`` (blocks of one row and four inputs, the two smallest |w|
zeroed; magnitude pruning, Mishra et al. 2021, "Accelerating Sparse Deep Neural Networks", §3). The library's
``FakeSparsity`` parametrization multiplies every forward pass by the mask, so fine-tuning trains only the kept weights
and the masks hold exactly; ``squash_mask`` then leaves plain zeros in the weights, which the exporter carries into
the ONNX initialisers (checked on the exported graph by :func:`check_2to4`).

Which layers: every ``nn.Linear`` whose ``in_features`` is a multiple of 4 (projections, FFNs, the feature embedding,
the output projection). The box-relational ``W_G`` (:class:`~edgecap.workshop.models.layers.geometry.GeometricBias`) is
left dense: its weight is read in four parts and multiplies box angles as the left operand, not as a GEMM's
constant weight, and holds ``heads·(d_g + 1)`` parameters. The image backbone of a pixels-in bundle is not part of a
run's weights (it is the feature cache's), so it stays dense.

On CPU this is a size and quality result only: ONNX Runtime's CPU kernels multiply the zeros like any other weight.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import nn

from edgecap.workshop.models.layers.geometry import GeometricBias

__all__ = ["PATTERNS", "SparsityError", "apply_2to4", "check_2to4", "finalize_2to4", "sparse_layers"]

PATTERNS = ("2:4",)


class SparsityError(ValueError):
    """An unknown sparsity pattern or a model with no layer that can take it."""


def parse_pattern(text: str) -> str:
    if text not in PATTERNS:
        raise SparsityError(f"sparsity pattern {text!r} is not supported; choose one of {list(PATTERNS)}")
    return text


def sparse_layers(model: nn.Module) -> list[str]:
    """Names of the ``Linear`` modules that take a 2:4 mask (``in_features % 4 == 0``, not a ``W_G``)."""
    skip = {f"{n}.proj" for n, m in model.named_modules() if isinstance(m, GeometricBias)}
    return [
        n for n, m in model.named_modules() if isinstance(m, nn.Linear) and m.in_features % 4 == 0 and n not in skip
    ]


def apply_2to4(model: nn.Module) -> Any:
    """Attach magnitude 2:4 masks to :func:`sparse_layers` (shared layers once); returns the sparsifier, whose
    :func:`finalize_2to4` bakes the zeros in.

    Raises:
        SparsityError: no layer qualifies.
    """
    from torch.ao.pruning import WeightNormSparsifier

    names = sparse_layers(model)
    if not names:
        raise SparsityError("the model has no Linear layer whose input width is a multiple of 4")
    sparsifier = WeightNormSparsifier(sparsity_level=1.0, sparse_block_shape=(1, 4), zeros_per_block=2)
    sparsifier.prepare(model, [{"tensor_fqn": f"{n}.weight"} for n in names])
    sparsifier.step()  # computes the masks once, from the starting magnitudes; fine-tuning keeps them fixed
    return sparsifier


def finalize_2to4(sparsifier: Any) -> None:
    """Remove the parametrizations, leaving ``weight = original · mask`` as a plain parameter."""
    sparsifier.squash_mask()


def groups_2to4(weight: np.ndarray, axis: int) -> bool:
    """Whether every group of four consecutive entries along ``axis`` has at least two zeros."""
    moved = np.moveaxis(np.asarray(weight), axis, -1)
    if moved.shape[-1] % 4:
        return False
    groups = moved.reshape(*moved.shape[:-1], -1, 4)
    return bool(((groups == 0).sum(-1) >= 2).all())


def check_2to4(model: nn.Module, names: list[str] | None = None) -> list[str]:
    """The names among ``names`` (default :func:`sparse_layers`) whose weight breaks 2:4 along its input axis."""
    modules = dict(model.named_modules())
    return [
        n
        for n in (names if names is not None else sparse_layers(model))
        if not groups_2to4(modules[n].weight.detach().cpu().numpy(), axis=1)
    ]


def onnx_2to4_report(model: Any, weights: dict[str, np.ndarray]) -> dict[str, str]:
    """For each ``Linear`` weight ``(out, in)`` in ``weights``, whether the exported ONNX graph ``model`` (a
    ``ModelProto`` or a path) holds it with its 2:4 groups intact along K: ``"ok"``, ``"broken"`` or ``"missing"``.

    The exporter may store a weight as is (``Gemm`` with ``transB``) or transposed (``MatMul`` with a folded
    ``Transpose``: K is then axis 0); an initialiser equal to either is found by value.
    """
    import onnx
    from onnx import numpy_helper

    graph = (model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))).graph
    inits = [numpy_helper.to_array(t) for t in graph.initializer]
    out: dict[str, str] = {}
    for name, w in weights.items():
        status = "missing"
        for arr in inits:
            if arr.shape == w.shape and np.array_equal(arr.astype(w.dtype), w):
                status = "ok" if groups_2to4(arr, axis=1) else "broken"
            elif arr.shape == w.T.shape and np.array_equal(arr.astype(w.dtype), w.T):
                status = "ok" if groups_2to4(arr, axis=0) else "broken"
            if status != "missing":
                break
        out[name] = status
    return out


def sparsity_summary(model: nn.Module, names: list[str]) -> dict[str, Any]:
    """Zeroed weights and their share of the masked layers' weights (for the run's record)."""
    modules = dict(model.named_modules())
    total = sum(modules[n].weight.numel() for n in names)
    zeros = sum(int((modules[n].weight == 0).sum()) for n in names)
    return {"weights": total, "zeros": zeros, "fraction": round(zeros / max(total, 1), 4)}


def to_numpy(model: nn.Module, names: list[str]) -> dict[str, np.ndarray]:
    """The weights of ``names`` as float32 arrays."""
    modules = dict(model.named_modules())
    return {n: modules[n].weight.detach().float().cpu().numpy() for n in names}
