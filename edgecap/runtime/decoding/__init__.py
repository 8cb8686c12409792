"""Decoding strategies written once against :class:`StepModel`: greedy, batched beam search and sampling; and
LaBERT's mask-predict-update against :class:`RefineModel`.

The same code runs on every backend (torch, ONNX Runtime, TensorRT) through ``edgecap.runtime.backends`` adapters;
search
knobs (min length, forbidden tokens, n-gram blocking, the radix constraint) are log-prob processors. The search runs
on numpy and imports no torch: adapters convert at the step boundary (``docs/contracts.md``, "StepModel").
"""

from edgecap.runtime.decoding.arrays import to_numpy
from edgecap.runtime.decoding.beam import beam_search
from edgecap.runtime.decoding.config import DecodeCfg, DecodeCfgError, RadixSpec
from edgecap.runtime.decoding.dispatch import decode
from edgecap.runtime.decoding.greedy import greedy
from edgecap.runtime.decoding.mask_predict import RefineModel, mask_predict
from edgecap.runtime.decoding.processors import (
    ForbidTokens,
    LengthPenalty,
    LogitsProcessor,
    MinLength,
    NoRepeatNGram,
    StepContext,
    build_processors,
)
from edgecap.runtime.decoding.protocol import DecodeInputError, Hypothesis, State, StepModel, stack_hypotheses
from edgecap.runtime.decoding.radix import RadixConstraint
from edgecap.runtime.decoding.sampling import sample
from edgecap.runtime.decoding.search import BeamSearch, GreedySearch, Sampling, Search

__all__ = [
    "BeamSearch",
    "DecodeCfg",
    "DecodeCfgError",
    "DecodeInputError",
    "ForbidTokens",
    "GreedySearch",
    "Hypothesis",
    "LengthPenalty",
    "LogitsProcessor",
    "MinLength",
    "NoRepeatNGram",
    "RadixConstraint",
    "RadixSpec",
    "RefineModel",
    "Sampling",
    "Search",
    "State",
    "StepContext",
    "StepModel",
    "beam_search",
    "build_processors",
    "decode",
    "greedy",
    "mask_predict",
    "sample",
    "stack_hypotheses",
    "to_numpy",
]
