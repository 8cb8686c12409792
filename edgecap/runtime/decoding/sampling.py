"""Multinomial sampling: n captions per image, the sampler of SCST (ACORT samples 15 per image at temperature 1)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from edgecap.runtime.decoding.config import DecodeCfg
from edgecap.runtime.decoding.greedy import decode_rows
from edgecap.runtime.decoding.processors import LogitsProcessor
from edgecap.runtime.decoding.protocol import Hypothesis, StepModel
from edgecap.runtime.decoding.search import Sampling


def sample(
    step_model: StepModel,
    inputs: Mapping[str, Any],
    cfg: DecodeCfg,
    processors: Sequence[LogitsProcessor] | None = None,
) -> list[list[Hypothesis]]:
    """Draw ``cfg.num_samples`` captions per image.

    Tokens are drawn from softmax(log-probs / ``temperature``), restricted to the ``top_k`` most likely when set, after
    the processors' masks. The reported per-token ``logprobs`` (and ``score``, their sum) are the model's log-probs
    of the drawn tokens *before* temperature and top-k, i.e. what a policy-gradient loss uses. With ``cfg.seed`` the
    draws are repeatable on every backend (a ``numpy.random.Generator``; its streams differ from the torch generator
    of earlier versions, so a seed now gives other samples than it did then).

    Args:
        step_model: any :class:`StepModel`.
        inputs: encoder inputs with batch B.
        cfg: ``num_samples``, ``temperature``, ``top_k``, ``seed``, ``max_len`` and the processor options.
        processors: replaces the processors ``cfg`` would build.

    Returns:
        B lists of ``num_samples`` hypotheses each, in draw order (not sorted).
    """
    search = Sampling(cfg.temperature, cfg.top_k, cfg.seed)
    return decode_rows(step_model, inputs, cfg, search, cfg.num_samples, processors)
