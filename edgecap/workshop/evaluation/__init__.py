"""Caption evaluation: the COCO metrics (pycocoevalcap), a fast CIDEr-D for validation and SCST rewards, and
caption statistics (uniqueness, length, vocabulary).

Nothing here starts a JVM or imports a scorer at import time; Java is needed only by the PTB tokenizer, METEOR and
SPICE when :func:`evaluate_captions` runs them.
"""

from __future__ import annotations

from edgecap.workshop.evaluation._inputs import CaptionInputError
from edgecap.workshop.evaluation.cider import CiderD, cider_d
from edgecap.workshop.evaluation.coco import (
    METRICS,
    MissingJavaError,
    TokenizerError,
    evaluate_captions,
    java_executable,
    ptb_tokenize,
    simple_tokenize,
    spice_unavailable_reason,
)
from edgecap.workshop.evaluation.report import METRIC_NAMES, EvalResult, format_markdown, format_table, print_result
from edgecap.workshop.evaluation.stats import CaptionStats, average_length, caption_stats, uniqueness, vocabulary

__all__ = [
    "METRICS",
    "METRIC_NAMES",
    "CaptionInputError",
    "CaptionStats",
    "CiderD",
    "EvalResult",
    "MissingJavaError",
    "TokenizerError",
    "average_length",
    "caption_stats",
    "cider_d",
    "evaluate_captions",
    "format_markdown",
    "format_table",
    "java_executable",
    "print_result",
    "ptb_tokenize",
    "simple_tokenize",
    "spice_unavailable_reason",
    "uniqueness",
    "vocabulary",
]
