"""``decode``: one entry point that picks the strategy named in a :class:`DecodeCfg`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from edgecap.runtime.decoding.beam import beam_search
from edgecap.runtime.decoding.config import DecodeCfg, DecodeCfgError
from edgecap.runtime.decoding.greedy import greedy
from edgecap.runtime.decoding.mask_predict import RefineModel, mask_predict
from edgecap.runtime.decoding.parallel import (
    PER_IMAGE_STRATEGIES,
    SPLIT_STRATEGIES,
    decode_workers_of,
    in_decode_chunk,
    rows_independent_of,
    split_decode,
)
from edgecap.runtime.decoding.processors import LogitsProcessor
from edgecap.runtime.decoding.protocol import Hypothesis, StepModel
from edgecap.runtime.decoding.sampling import sample

Strategy = Callable[..., list[list[Hypothesis]]]

STRATEGY_FNS: dict[str, Strategy] = {
    "greedy": greedy,
    "beam": beam_search,
    "sample": sample,
    "mask_predict": mask_predict,
}
#: Encoder input that carries the length level to a length-aware autoregressive model (LaBERT §3.1).
LENGTH_LEVEL_INPUT = "length_level"


def decode(
    step_model: StepModel | RefineModel,
    inputs: Mapping[str, Any],
    cfg: DecodeCfg,
    processors: Sequence[LogitsProcessor] | None = None,
) -> list[list[Hypothesis]]:
    """Decode a batch with ``cfg.strategy`` (``"greedy"``, ``"beam"``, ``"sample"`` or ``"mask_predict"``).

    With ``cfg.length_level`` set, an autoregressive strategy feeds ``length_level`` (B,) int64 to the step model's
    encoder next to the visual inputs (the level rides in the decoder state from there); ``"mask_predict"`` needs a
    :class:`~edgecap.runtime.decoding.mask_predict.RefineModel` instead of a step model.

    Args:
        step_model: any :class:`~edgecap.runtime.decoding.StepModel` (torch, ONNX Runtime, TensorRT adapters), or a
            ``RefineModel`` for ``"mask_predict"``.
        inputs: encoder inputs with batch B, e.g. ``features`` (B, N, C), ``boxes`` (B, N, 4), ``feature_mask`` (B, N);
            numpy arrays or torch tensors, handed to the model's ``encode`` as they are.
        cfg: the decoding configuration.
        processors: replaces the processors built from ``cfg`` (see :func:`build_processors`).

    A step model with ``decode_workers`` > 1 (ONNX Runtime on spare CPU cores) decodes greedy and beam batches as
    that many concurrent chunks of images (:mod:`edgecap.runtime.decoding.parallel`); the hypotheses are the same. A
    model
    whose rows are not independent (``rows_independent`` False: a dynamic INT8 step) decodes greedy, beam and
    mask-predict batches image by image, so an image's caption does not depend on its batch.

    Returns:
        B lists of hypotheses: 1 (greedy), ``n_best`` (beam, best first) or ``num_samples`` (sample, draw order).
    """
    fn = STRATEGY_FNS.get(cfg.strategy)
    if fn is None:
        raise DecodeCfgError(f"unknown decoding strategy {cfg.strategy!r}; known: {sorted(STRATEGY_FNS)}")
    if cfg.length_level is not None and cfg.strategy != "mask_predict":
        inputs = {**inputs, LENGTH_LEVEL_INPUT: _levels_like(inputs, cfg.length_level)}
    workers = decode_workers_of(step_model)
    per_image = not rows_independent_of(step_model) and cfg.strategy in PER_IMAGE_STRATEGIES
    split = per_image or (workers > 1 and cfg.strategy in SPLIT_STRATEGIES)
    if split and processors is None and not in_decode_chunk() and inputs:
        return split_decode(lambda chunk: fn(step_model, chunk, cfg, None), inputs, workers, per_image=per_image)
    return fn(step_model, inputs, cfg, processors)


def _levels_like(inputs: Mapping[str, Any], level: int) -> np.ndarray:
    first = next(iter(inputs.values()), None)
    batch = int(first.shape[0]) if first is not None else 1
    return np.full(batch, level, dtype=np.int64)
