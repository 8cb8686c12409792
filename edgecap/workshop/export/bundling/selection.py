"""Accuracy-aware INT8 inside an export: from the fully quantised graphs to the fewest layers kept float that meet
the target on the held-out set (``edgecap.workshop.export.calibration.sensitivity``), and the manifest's record of it.

Called by :func:`~edgecap.workshop.export.bundling.int8.build_int8_variant` before any INT8 graph is written, so a
target that cannot be met fails the export inside the bundle's temporary directory: nothing is left on disk.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgecap.workshop.export.bundling import BundleExportError
from edgecap.workshop.export.bundling.console import Stages
from edgecap.workshop.export.bundling.request import DEFAULT_RANKING_IMAGES
from edgecap.workshop.export.calibration.sensitivity import Int8Target

__all__ = ["DEFAULT_RANKING_IMAGES", "Int8Selector", "ranking_batches"]

#: Repeats of the batch-1 latency record.
LATENCY_REPEATS = 5


def ranking_batches(batches: Sequence[Mapping[str, np.ndarray]], images: int) -> list[dict[str, np.ndarray]]:
    """The first ``images`` rows of ``batches`` (batch boundaries kept, the last batch cut)."""
    out: list[dict[str, np.ndarray]] = []
    left = images
    for batch in batches:
        if left <= 0:
            break
        rows = int(next(iter(batch.values())).shape[0])
        out.append({k: np.asarray(v)[: min(rows, left)] for k, v in batch.items()})
        left -= rows
    return out


@dataclass
class Int8Selector:
    """What the selection needs besides the quantised graphs.

    Attributes:
        target: the accuracy target.
        check: role -> graphs => the held-out task-level check record (``bundling.quality.task_check``).
        spec, cfg, vocab: the export spec, the deployed decode config and the vocabulary.
        params: ``calibration.layers.param_index`` of the exported torch modules (names layers by module).
        ranking_images: calibration images the layers are ranked on.
    """

    target: Int8Target
    check: Callable[[Mapping[str, Any]], dict[str, Any]]
    spec: Any
    cfg: Any
    vocab: Any
    params: Mapping[str, str]
    ranking_images: int = DEFAULT_RANKING_IMAGES

    def _captions(self, batches: Sequence[Mapping[str, Any]]) -> Callable[[Mapping[str, Any]], list[list[int]]]:
        from edgecap.runtime.backends.onnxruntime.decoders import create_onnxruntime_decoder
        from edgecap.runtime.decoding import decode

        def captions(models: Mapping[str, Any]) -> list[list[int]]:
            tokens: list[list[int]] = []
            with create_onnxruntime_decoder(
                dict(models), self.spec.state_names, updated_state_names=self.spec.step_state_names, providers=("cpu",)
            ) as model:
                for batch in batches:
                    tokens.extend(list(h[0].tokens) for h in decode(model, dict(batch), self.cfg))
            return tokens

        return captions

    def select(
        self,
        fp32: Mapping[str, Any],
        quantized: Mapping[str, Any],
        originals: Mapping[str, Any],
        op_types: Mapping[str, Sequence[str]],
        batches: Sequence[Mapping[str, np.ndarray]],
        stages: Stages,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(graphs, record)``: the INT8 graphs with the selected layers in float, and the manifest's ``selection``.

        ``originals``/``op_types``: per statically quantised role, its pre-processed FP32 graph and quantised op
        types (other roles are not ranked).

        Raises:
            BundleExportError: the target does not hold even with every ranked layer in float.
        """
        from edgecap.workshop.export.calibration.layers import quantised_layers
        from edgecap.workshop.export.calibration.sensitivity import models_with_float, rank_layers, smallest_count

        started = time.perf_counter()
        layers = [
            layer
            for role in originals
            for layer in quantised_layers(quantized[role], originals[role], role, op_types[role], self.params)
        ]
        qualities: dict[int, dict[str, Any]] = {0: self.check(quantized)}
        record: dict[str, Any] = {"target": self.target.record(), "layers_considered": len(layers)}
        if not self.target.shortfalls(qualities[0]):
            stages.note(f"accuracy-aware INT8: the fully quantised graphs meet the target; {len(layers)} layers INT8")
            ranked: list[Any] = []
            record.update(ranking=None, kept_float=[], search={"order": "galloping+bisection", "tried": {"0": True}})
        else:
            ranking = ranking_batches(batches, self.ranking_images)
            images = sum(int(next(iter(b.values())).shape[0]) for b in ranking)
            stages.note(
                f"accuracy-aware INT8: {'; '.join(self.target.shortfalls(qualities[0]))}: ranking {len(layers)} "
                f"layers by leave-one-out on {images} calibration images"
            )
            captions = self._captions(ranking)
            base, effects = rank_layers(layers, quantized, originals, captions, captions(fp32), self.vocab)
            ranked = [e.layer for e in effects]

            def holds(k: int) -> bool:
                if k not in qualities:
                    qualities[k] = self.check(models_with_float(quantized, originals, ranked[:k]))
                return not self.target.shortfalls(qualities[k])

            found = smallest_count(len(ranked), holds)
            if found.count is None:
                raise BundleExportError(_unreachable(self.target, qualities, len(ranked)))
            record.update(
                ranking={
                    "images": images,
                    "set": "calibration images (FP32 ONNX captions as reference)",
                    "method": "leave-one-out",
                    "full_int8": {k: round(v, 6) for k, v in base.items()},
                },
                kept_float=[e.record() for e in effects[: found.count]],
                search={
                    "order": "galloping+bisection (assumes quality grows with the float layers kept)",
                    "tried": {str(k): v for k, v in sorted(found.tried.items())},
                },
            )
            ranked = ranked[: found.count]
        selected = models_with_float(quantized, originals, ranked)
        kept = len(ranked)
        record["full_int8_quality"] = _brief(qualities[0])
        record["quality"] = _brief(qualities[kept])
        stages.note(
            f"accuracy-aware INT8: {kept} layer(s) kept float: {', '.join(x.key for x in ranked) or 'none'}; "
            f"{_describe(qualities[kept])}"
        )
        record["latency"] = self._latency(fp32, quantized, selected, batches)
        record["seconds"] = round(time.perf_counter() - started, 1)
        return selected, record

    def _latency(
        self,
        fp32: Mapping[str, Any],
        quantized: Mapping[str, Any],
        selected: Mapping[str, Any],
        batches: Sequence[Mapping[str, np.ndarray]],
    ) -> dict[str, Any]:
        from edgecap.workshop.export.calibration.latency import graph_latencies

        one = ranking_batches(batches, 1)[0]
        same = selected is quantized or all(selected[r] is quantized[r] for r in quantized)
        variants = {"fp32": fp32, "int8": quantized, **({} if same else {"selected": selected})}
        measured = graph_latencies(variants, self.spec, one, self.cfg, LATENCY_REPEATS)
        if same:  # nothing kept float: the selected graphs are the fully quantised ones
            measured["selected"] = measured["int8"]
        return {"batch": 1, "threads": 1, "repeats": LATENCY_REPEATS, "provider": "cpu", **measured}


def _brief(quality: Mapping[str, Any]) -> dict[str, Any]:
    keep = ("reference_cider_d", "candidate_cider_d", "cider_d_delta", "agreement", "token_agreement", "images")
    out = {k: quality[k] for k in keep if k in quality}
    if "levels" in quality:
        out["levels"] = {lv: {k: v for k, v in f.items() if k in keep} for lv, f in quality["levels"].items()}
    return out


def _describe(quality: Mapping[str, Any]) -> str:
    drop = 100.0 * (quality["reference_cider_d"] - quality["candidate_cider_d"])
    return f"held-out CIDEr-D {drop:+.2f} points below FP32, {quality['agreement']:.1%} identical captions"


def _unreachable(target: Int8Target, qualities: Mapping[int, Mapping[str, Any]], layers: int) -> str:
    best_k = max(qualities, key=lambda k: (qualities[k]["agreement"], qualities[k]["candidate_cider_d"], -k))
    best = qualities[best_k]
    return (
        f"accuracy-aware INT8 cannot meet the target {target.record()} on the held-out set: even with all {layers} "
        f"ranked layers in float it misses ({'; '.join(target.shortfalls(qualities[layers]))}). Best reached: "
        f"{best_k} float layer(s), {_describe(best)}. Nothing was written; relax --max-cider-drop/--min-agreement, "
        "or export without them"
    )
