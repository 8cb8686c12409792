"""Graph inspection and surgery on the FP32 and QDQ graphs of a quantisation run.

- :func:`graph_inputs`: what a graph is fed (initialisers excluded), with the dtypes feeds are cast to.
- Exclusions: ``exclude_nodes`` names or ``fnmatch`` globs, optionally role-prefixed (``"step:node_*"``), matched
  against each graph; a pattern that matches nothing raises instead of silently doing nothing.
- The nodes a preset's policy keeps float: attention's activation × activation matmuls and activations that are not
  a conv's epilogue.
- :func:`prune_opset_imports`: a quantised graph declares only the opset domains its nodes use.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from edgecap.workshop.export.calibration.source import CalibrationError

__all__ = [
    "activation_matmuls",
    "check_exclusions",
    "for_role",
    "graph_inputs",
    "match_nodes",
    "prune_opset_imports",
    "split_role",
    "unfused_activations",
]


def graph_inputs(model: Any) -> dict[str, np.dtype]:
    """The feed inputs of an ONNX model (initialisers excluded), name -> numpy dtype, in graph order."""
    import onnx

    initializers = {t.name for t in model.graph.initializer}
    out: dict[str, np.dtype] = {}
    for vi in model.graph.input:
        if vi.name not in initializers:
            out[vi.name] = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
    return out


# -- exclusions ------------------------------------------------------------------------------------------------------
def split_role(item: str, roles: Iterable[str]) -> tuple[str | None, str]:
    """``"step:node_*"`` -> ``("step", "node_*")`` when ``step`` is a role; otherwise ``(None, item)``."""
    role, sep, rest = item.partition(":")
    return (role, rest) if sep and role in roles else (None, item)


def for_role(items: Iterable[str], role: str, roles: Iterable[str]) -> list[str]:
    """The items that apply to ``role`` (unprefixed ones and those prefixed with it), without their prefix."""
    out = []
    for item in items:
        target, value = split_role(item, roles)
        if target is None or target == role:
            out.append(value)
    return out


def match_nodes(model: Any, patterns: Sequence[str]) -> dict[str, list[str]]:
    """pattern -> names of the nodes it matches (``fnmatch`` globs; an exact name is a glob too)."""
    names = [n.name for n in model.graph.node if n.name]
    return {p: [n for n in names if fnmatch.fnmatchcase(n, p)] for p in patterns}


def check_exclusions(models: Mapping[str, Any], exclude_nodes: Sequence[str]) -> None:
    """Every exclusion pattern must match a node of some graph it targets: a typo must not silently do nothing."""
    roles = list(models)
    unmatched = []
    for item in exclude_nodes:
        target, pattern = split_role(item, roles)
        targets = [target] if target is not None else roles
        if not any(match_nodes(models[r], [pattern])[pattern] for r in targets):
            unmatched.append(item)
    if unmatched:
        sample = {
            r: [n.name for n in m.graph.node if n.op_type in ("MatMul", "Gemm", "Conv")][:8] for r, m in models.items()
        }
        raise CalibrationError(
            f"exclude_nodes pattern(s) {unmatched} match no node of {sorted(roles)}; "
            f"node names look like {sample} (prefix a pattern with 'encoder:' or 'step:' to target one graph)"
        )


# -- nodes a policy keeps float --------------------------------------------------------------------------------------
def activation_matmuls(model: Any) -> list[str]:
    """Names of ``MatMul``/``Gemm`` nodes whose second operand is computed, not a weight (attention's Q·Kᵀ and
    weights·V): they stay float under ``RolePolicy.weight_matmuls_only``."""
    constants = {t.name for t in model.graph.initializer}
    constants.update(o for n in model.graph.node if n.op_type == "Constant" for o in n.output)
    return sorted(
        n.name
        for n in model.graph.node
        if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 and n.input[1] not in constants
    )


def unfused_activations(model: Any, fused: Iterable[str]) -> list[str]:
    """Names of ``RolePolicy.fused_activations`` nodes that do not directly follow a ``Conv``: they stay float (a
    ``Relu`` after a residual ``Add`` or in a transformer's feed-forward is not an integer conv's epilogue)."""
    wanted = set(fused)
    if not wanted:
        return []
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    after_conv = {n.name for n in model.graph.node if n.input and producers.get(n.input[0]) == "Conv"}
    return sorted(n.name for n in model.graph.node if n.op_type in wanted and n.name not in after_conv)


# -- surgery ---------------------------------------------------------------------------------------------------------
def prune_opset_imports(model: Any) -> None:
    """Drop opset imports of domains no node uses (onnxruntime's pre-processing and quantiser add ``com.microsoft``,
    ``ai.onnx.ml`` …), so the quantised file declares only what it needs."""
    used = {n.domain for n in model.graph.node} | {"", "ai.onnx"}
    keep = [imp for imp in model.opset_import if imp.domain in used]
    if len(keep) != len(model.opset_import):
        del model.opset_import[:]
        model.opset_import.extend(keep)
