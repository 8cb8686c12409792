"""Batch-1, one-thread latency of a captioner's graphs on ONNX Runtime (CPU), for the record of accuracy-aware INT8.

Keeping layers in float buys quality with speed; the manifest records what the selection cost, measured the way edge
deployments are compared (batch 1, one intra-op thread): the encoder call, the mean decoder call (``step``, or
LaBERT's ``refine``) and the whole caption, each the median of a few repeats after one warm-up decode. Variants are
interleaved repeat by repeat so a load change on the machine hits them alike. It is a record, not a benchmark: use
``edgecap bench`` for numbers to publish.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from typing import Any

__all__ = ["LOOP_CALLS", "graph_latencies"]

#: The decoder's per-token calls (autoregressive ``step``, mask-predict ``refine``).
LOOP_CALLS = ("step", "refine")


class _Timed:
    """Delegates to a step/refine model, adding up the seconds spent in ``encode`` and in its loop calls."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.encode_s, self.loop_s, self.loop_calls = 0.0, 0.0, 0

    def encode(self, inputs: Mapping[str, Any]) -> Any:
        start = time.perf_counter()
        try:
            return self._inner.encode(inputs)
        finally:
            self.encode_s += time.perf_counter() - start

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(self._inner, name)
        if name not in LOOP_CALLS:
            return value

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return value(*args, **kwargs)
            finally:
                self.loop_s += time.perf_counter() - start
                self.loop_calls += 1

        return timed


def graph_latencies(
    variants: Mapping[str, Mapping[str, Any]], spec: Any, inputs: Mapping[str, Any], cfg: Any, repeats: int = 5
) -> dict[str, dict[str, float]]:
    """Per variant name (e.g. ``fp32``, ``int8``, ``int8-selected``): ``encoder_ms``, ``step_ms`` (mean decoder-loop
    call) and ``caption_ms``, medians over ``repeats`` interleaved decodes of ``inputs`` (one image) at one thread.

    Raises:
        ValueError: ``repeats`` < 1 or ``inputs`` holds more than one image.
    """
    import numpy as np

    from edgecap.runtime.backends.onnxruntime.decoders import create_onnxruntime_decoder
    from edgecap.runtime.decoding import decode

    if repeats < 1:
        raise ValueError(f"graph_latencies: repeats must be >= 1, got {repeats}")
    rows = {int(np.asarray(v).shape[0]) for v in inputs.values()}
    if rows != {1}:
        raise ValueError(f"graph_latencies: time one image at a time (batch 1), got batch sizes {sorted(rows)}")
    options: dict[str, Any] = {
        "providers": ("cpu",),
        "intra_op_threads": 1,
        "inter_op_threads": 1,
        "session_config": {"session.intra_op.allow_spinning": "0"},
    }
    samples: dict[str, dict[str, list[float]]] = {name: {"encoder": [], "step": [], "caption": []} for name in variants}
    decoders = {
        name: create_onnxruntime_decoder(models, spec.state_names, updated_state_names=spec.step_state_names, **options)
        for name, models in variants.items()
    }
    try:
        opened = {name: d.__enter__() for name, d in decoders.items()}
        for model in opened.values():
            decode(model, dict(inputs), cfg)  # warm-up: session creation, first-run allocations
        for _ in range(repeats):
            for name, model in opened.items():
                timed = _Timed(model)
                start = time.perf_counter()
                decode(timed, dict(inputs), cfg)
                samples[name]["caption"].append(time.perf_counter() - start)
                samples[name]["encoder"].append(timed.encode_s)
                samples[name]["step"].append(timed.loop_s / max(1, timed.loop_calls))
    finally:
        for d in decoders.values():
            d.__exit__(None, None, None)
    return {
        name: {f"{part}_ms": round(1000.0 * statistics.median(values), 3) for part, values in parts.items()}
        for name, parts in samples.items()
    }
