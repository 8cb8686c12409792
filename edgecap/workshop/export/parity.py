"""Numeric parity of exported graphs against PyTorch, in Polygraphy's style.

:func:`check_runtime` is the shared helper (Polygraphy's ``check_runner``): run a
:class:`~edgecap.runtime.backends.Runtime`
and a reference function on the same feeds and compare every output element-wise against a :class:`Tolerance`.
:func:`check_graph` applies it to one graph of an :class:`~edgecap.workshop.export.spec.ExportSpec`: fresh random
inputs at
every ``parity_sizes`` entry (batch 1 and > 1, cache length 0 and > 0 — never only the export example), on ONNX
Runtime, with the spec's tolerance for the precision. Reports are plain dicts, ready for JSON (export writes them
into its result; the bundle manifest consumes them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from edgecap.runtime.backends.base import Array, Runtime
from edgecap.runtime.bundle.manifest import jsonable
from edgecap.workshop.export.spec import ExportSpec, Tolerance

__all__ = ["ParityError", "check_graph", "check_runtime", "compare_arrays", "parity_summary", "torch_reference"]

ToleranceLike = Tolerance | Mapping[str, Tolerance] | Callable[[str], Tolerance]

#: Reference values at or below this are "never" entries: the −1e4 bias of an output class a model cannot emit (an
#: imported ORT model's PAD/BOS) or a −1e4 mask, and log-probabilities derived from them. Their probability is exactly
#: 0 either way, and at that magnitude one float32 rounding step is ~1e-3, which would dominate ``max_abs`` and read as
#: a failure beside an atol of 1e-4. They are compared on what they mean (both sides at or below this) and left out
#: of the error statistics; the report counts them as ``never``.
NEVER_BELOW = -5e3


class ParityError(ValueError):
    """Outputs that cannot be compared at all (missing output, shape or dtype mismatch)."""


def _to_numpy(value: Array) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def compare_arrays(actual: Array, expected: Array, tolerance: Tolerance) -> dict[str, Any]:
    """Element-wise comparison of one output.

    Returns:
        ``max_abs`` and ``mean_abs`` error, ``max_rel`` (over elements with ``|expected| > atol``, where a relative
        error means something), ``violations`` (elements outside ``atol + rtol * |expected|``), ``passed`` and
        ``never``: float elements whose reference is at or below :data:`NEVER_BELOW` (a −1e4 "never" logit); they
        must be at or below it on both sides and are left out of the error statistics.
        Integer/bool outputs must match exactly; a NaN anywhere fails.

    Raises:
        ParityError: shapes or dtypes differ (a float16 output where float32 is expected is an export bug, whatever
            the values).
    """
    a, e = _to_numpy(actual), _to_numpy(expected)
    if a.shape != e.shape:
        raise ParityError(f"shape {a.shape} != reference {e.shape}")
    if a.dtype != e.dtype:
        raise ParityError(f"dtype {a.dtype} != reference {e.dtype}")
    if a.size == 0:
        return {
            "max_abs": 0.0, "mean_abs": 0.0, "max_rel": 0.0, "violations": 0, "elements": 0, "never": 0, "passed": True
        }  # fmt: skip
    if not np.issubdtype(e.dtype, np.floating):
        mismatches = int(np.count_nonzero(a != e))
        return {
            "max_abs": float(mismatches > 0),
            "mean_abs": mismatches / a.size,
            "max_rel": float(mismatches > 0),
            "violations": mismatches,
            "elements": int(a.size),
            "never": 0,
            "passed": mismatches == 0,
        }
    a64, e64 = a.astype(np.float64), e.astype(np.float64)
    diff = np.abs(a64 - e64)
    nan = np.isnan(diff)
    never = (e64 <= NEVER_BELOW) & (a64 <= NEVER_BELOW)  # both "impossible": the values carry nothing more
    counted = ~nan & ~never
    bound = tolerance.atol + tolerance.rtol * np.abs(e64)
    violations = int(np.count_nonzero(nan | (counted & (diff > bound))))
    significant = counted & (np.abs(e64) > max(tolerance.atol, 1e-12))
    max_rel = float(np.max(diff[significant] / np.abs(e64[significant]))) if significant.any() else 0.0
    empty = 0.0 if never.all() else float("nan")
    return {
        "max_abs": float(np.max(diff[counted])) if counted.any() else empty,
        "mean_abs": float(np.mean(diff[counted])) if counted.any() else empty,
        "max_rel": max_rel,
        "violations": violations,
        "elements": int(a.size),
        "never": int(np.count_nonzero(never)),
        "passed": violations == 0 and not nan.any(),
    }


def _tolerance_for(tolerance: ToleranceLike, output: str) -> Tolerance:
    if isinstance(tolerance, Tolerance):
        return tolerance
    if callable(tolerance):
        return tolerance(output)
    try:
        return tolerance[output]
    except KeyError:
        raise ParityError(f"no tolerance given for output {output!r}") from None


def check_runtime(
    runtime: Runtime,
    reference_fn: Callable[[Mapping[str, Array]], Mapping[str, Array]],
    feeds: Sequence[Mapping[str, Array]],
    tolerance: ToleranceLike,
    *,
    output_names: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Run ``runtime`` and ``reference_fn`` on each feed and compare every output (Polygraphy's ``check_runner``).

    Args:
        runtime: an *active* runtime, or an inactive one (activated and closed here).
        reference_fn: feed -> outputs by name (e.g. :func:`torch_reference` of the graph's module).
        feeds: input dicts; each is one comparison.
        tolerance: one :class:`Tolerance`, a mapping output -> tolerance, or a function of the output name.
        output_names: compare only these outputs; default every output the reference returns.

    Returns:
        ``{"passed", "feeds", "outputs": {name: {"max_abs", "mean_abs", "max_rel", "violations", "atol", "rtol",
        "passed", "worst_feed"}}, "runs": [per-feed shapes]}``; errors aggregate as the maximum over feeds.

    Raises:
        ParityError: an output is missing or its shape differs from the reference.
    """
    if not feeds:
        raise ParityError("check_runtime needs at least one feed")
    opened = not runtime.is_active
    if opened:
        runtime.activate()
    try:
        outputs: dict[str, dict[str, Any]] = {}
        runs = []
        for index, feed in enumerate(feeds):
            expected = reference_fn(feed)
            actual = runtime.infer(feed)
            names = list(output_names or expected)
            runs.append({n: list(np.shape(_to_numpy(feed[n]))) for n in feed})
            for name in names:
                if name not in actual:
                    raise ParityError(f"{runtime.name}: output {name!r} missing (got {sorted(actual)})")
                if name not in expected:
                    raise ParityError(f"reference produced no output {name!r} (got {sorted(expected)})")
                tol = _tolerance_for(tolerance, name)
                try:
                    stats = compare_arrays(actual[name], expected[name], tol)
                except ParityError as exc:
                    raise ParityError(f"{runtime.name}: output {name!r} on feed {index}: {exc}") from exc
                _merge(outputs, name, stats, tol, index)
    finally:
        if opened:
            runtime.close()
    return {"passed": all(o["passed"] for o in outputs.values()), "feeds": len(feeds), "outputs": outputs, "runs": runs}


def _merge(outputs: dict[str, dict[str, Any]], name: str, stats: Mapping[str, Any], tol: Tolerance, index: int) -> None:
    entry = outputs.get(name)
    if entry is None:
        outputs[name] = {**stats, **tol.to_dict(), "worst_feed": index}
        return
    if stats["max_abs"] > entry["max_abs"] or np.isnan(stats["max_abs"]):
        entry["worst_feed"] = index
    entry["max_abs"] = float(np.nanmax([entry["max_abs"], stats["max_abs"]]))
    entry["max_rel"] = max(entry["max_rel"], stats["max_rel"])
    entry["mean_abs"] = max(entry["mean_abs"], stats["mean_abs"])
    entry["violations"] += stats["violations"]
    entry["elements"] += stats["elements"]
    entry["never"] = entry.get("never", 0) + stats.get("never", 0)
    entry["passed"] = entry["passed"] and stats["passed"]


def torch_reference(module: torch.nn.Module, inputs: Sequence[str], outputs: Sequence[str]) -> Callable[..., dict]:
    """``feed -> {output: numpy}`` running ``module`` positionally in float32 eval mode under ``no_grad``."""

    def run(feed: Mapping[str, Array]) -> dict[str, np.ndarray]:
        args = [torch.as_tensor(_to_numpy(feed[n])) for n in inputs]
        with torch.no_grad():
            result = module(*args)
        if len(result) != len(outputs):
            raise ParityError(f"reference returned {len(result)} outputs, expected {len(outputs)} ({list(outputs)})")
        return {n: _to_numpy(v) for n, v in zip(outputs, result, strict=True)}

    return run


def check_graph(
    spec: ExportSpec,
    graph_name: str,
    onnx_model: Any,
    precision: str,
    *,
    seed: int = 1234,
    sizes: Sequence[Mapping[str, int]] | None = None,
    providers: Sequence[str] | None = ("cpu",),
    runtime_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Parity of one exported graph against its torch module on fresh random inputs.

    Args:
        spec: the export spec.
        graph_name: which graph.
        onnx_model: the exported graph (``ModelProto``, bytes or path).
        precision: selects the tolerance (``spec.graph(...).tolerance(precision, output)``).
        seed: parity inputs are drawn from ``torch.Generator().manual_seed(seed + i)`` for size set ``i``; export
            traces with seed 0, so the default never reuses the export inputs.
        sizes: size combinations; default ``spec.parity_sizes``.
        providers: ONNX Runtime providers (CPU by default: parity must not depend on which GPU is around).
        runtime_options: more :class:`~edgecap.runtime.backends.onnxruntime.session.OnnxRuntimeSession` options.

    Returns:
        The :func:`check_runtime` report plus ``graph``, ``precision``, ``seed`` and ``sizes``.
    """
    from edgecap.runtime.backends.onnxruntime.session import OnnxRuntimeSession

    graph = spec.graph(graph_name)
    module = graph.module.eval()
    size_sets = [spec.sizes_for(graph, s) for s in (sizes if sizes is not None else spec.parity_sizes)]
    feeds = []
    for i, s in enumerate(size_sets):
        made = graph.make_inputs(s, torch.Generator().manual_seed(seed + i))
        feeds.append({n: _to_numpy(made[n]) for n in graph.inputs})
    runtime = OnnxRuntimeSession(
        onnx_model, providers=providers, name=f"{spec.name}/{graph.name} ({precision})", **dict(runtime_options or {})
    )
    report = check_runtime(
        runtime,
        torch_reference(module, graph.inputs, graph.outputs),
        feeds,
        lambda output: graph.tolerance(precision, output),
    )
    used = graph.dims_used()
    return {
        "graph": graph.name,
        "precision": precision,
        "seed": seed,
        "sizes": [{d: s[d] for d in used} for s in size_sets],
        **report,
    }


def parity_summary(report: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a parity report (:func:`check_graph`) a bundle's manifest keeps: verdict, the sizes checked and per
    output the error statistics next to the tolerance they were held to."""
    keep = ("max_abs", "mean_abs", "max_rel", "violations", "never", "atol", "rtol", "passed")
    return jsonable(
        {
            "passed": bool(report["passed"]),
            "feeds": report.get("feeds"),
            "sizes": report.get("sizes"),
            "outputs": {name: {k: out.get(k) for k in keep} for name, out in report.get("outputs", {}).items()},
        }
    )
