"""``decode``: one entry point that picks the strategy named in a :class:`DecodeCfg`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from torch import Tensor

from edgecap.decoding.beam import beam_search
from edgecap.decoding.config import DecodeCfg, DecodeCfgError
from edgecap.decoding.greedy import greedy
from edgecap.decoding.processors import LogitsProcessor
from edgecap.decoding.protocol import Hypothesis, StepModel
from edgecap.decoding.sampling import sample

Strategy = Callable[..., list[list[Hypothesis]]]

STRATEGY_FNS: dict[str, Strategy] = {"greedy": greedy, "beam": beam_search, "sample": sample}


def decode(
    step_model: StepModel,
    inputs: Mapping[str, Tensor],
    cfg: DecodeCfg,
    processors: Sequence[LogitsProcessor] | None = None,
) -> list[list[Hypothesis]]:
    """Decode a batch with ``cfg.strategy`` (``"greedy"``, ``"beam"`` or ``"sample"``).

    Args:
        step_model: any :class:`~edgecap.decoding.StepModel` (torch, ONNX Runtime, TensorRT adapters).
        inputs: encoder inputs with batch B, e.g. ``features`` (B, N, C), ``boxes`` (B, N, 4), ``feature_mask`` (B, N).
        cfg: the decoding configuration.
        processors: replaces the processors built from ``cfg`` (see :func:`build_processors`).

    Returns:
        B lists of hypotheses: 1 (greedy), ``n_best`` (beam, best first) or ``num_samples`` (sample, draw order).
    """
    fn = STRATEGY_FNS.get(cfg.strategy)
    if fn is None:
        raise DecodeCfgError(f"unknown decoding strategy {cfg.strategy!r}; known: {sorted(STRATEGY_FNS)}")
    return fn(step_model, inputs, cfg, processors)
