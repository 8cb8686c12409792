"""Decoding strategies written once against :class:`StepModel`: greedy, batched beam search and sampling; and
LaBERT's mask-predict-update against :class:`RefineModel`.

The same code runs on every backend (torch, ONNX Runtime, TensorRT) through ``edgecap.runtimes`` adapters; search
knobs (min length, forbidden tokens, n-gram blocking, the radix constraint) are log-prob processors. The search runs
on numpy and imports no torch: adapters convert at the step boundary (``docs/contracts.md``, "StepModel").
"""

from edgecap.decoding.arrays import to_numpy
from edgecap.decoding.beam import beam_search
from edgecap.decoding.config import DecodeCfg, DecodeCfgError, RadixSpec
from edgecap.decoding.dispatch import decode
from edgecap.decoding.greedy import greedy
from edgecap.decoding.mask_predict import RefineModel, mask_predict
from edgecap.decoding.processors import (
    ForbidTokens,
    LengthPenalty,
    LogitsProcessor,
    MinLength,
    NoRepeatNGram,
    StepContext,
    build_processors,
)
from edgecap.decoding.protocol import DecodeInputError, Hypothesis, State, StepModel, stack_hypotheses
from edgecap.decoding.radix import RadixConstraint
from edgecap.decoding.sampling import sample
from edgecap.decoding.search import BeamSearch, GreedySearch, Sampling, Search

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
