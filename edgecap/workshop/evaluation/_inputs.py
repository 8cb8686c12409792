"""Checking and normalising the caption mappings every metric front end receives.

A caption may be given as a string or as its word tokens; both become one string here, so that the tokenizer of
the metric (PTB or simple) sees the same text either way.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

__all__ = ["CaptionInputError", "caption_text", "check_inputs"]


class CaptionInputError(ValueError):
    """Predictions or references that cannot be scored (missing ids, empty sets, malformed captions)."""


def _describe(ids: set[Hashable], limit: int = 5) -> str:
    shown = sorted(ids, key=repr)[:limit]
    more = f" and {len(ids) - limit} more" if len(ids) > limit else ""
    return ", ".join(repr(i) for i in shown) + more


def caption_text(value: object, *, what: str) -> str:
    """One caption as a string: a ``str`` as is, a sequence of word tokens joined by spaces.

    A one-element list holding a whole sentence (pycocoevalcap's ``res`` format) is accepted; several strings that
    contain spaces are rejected, since they look like several captions where one is expected.

    Raises:
        CaptionInputError: neither a string nor a sequence of strings, or several sentences.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, bytes) or not isinstance(value, Sequence):
        raise CaptionInputError(f"{what} must be a str or a sequence of str tokens, got {type(value).__name__}")
    tokens = list(value)
    for token in tokens:
        if not isinstance(token, str):
            raise CaptionInputError(f"{what}: tokens must be str, got {type(token).__name__} ({token!r})")
    if len(tokens) > 1 and any(any(ch.isspace() for ch in token) for token in tokens):
        raise CaptionInputError(
            f"{what} is a list of {len(tokens)} strings with spaces in them, i.e. several captions; "
            "give exactly one caption (a str, or a list of word tokens)"
        )
    return " ".join(tokens)


def check_inputs(
    predictions: Mapping[Any, object], references: Mapping[Any, object]
) -> tuple[list[Hashable], dict[Hashable, str], dict[Hashable, list[str]]]:
    """Validate predictions against references and return them as plain strings.

    Returns:
        The image ids (in the order of ``predictions``), id -> prediction string, id -> reference strings.

    Raises:
        CaptionInputError: not mappings, empty, ids present on only one side (named in the message), ids that
            collide once written as strings, an image without references, or malformed captions.
    """
    if not isinstance(predictions, Mapping):
        raise CaptionInputError(f"predictions must be a mapping image id -> caption, got {type(predictions).__name__}")
    if not isinstance(references, Mapping):
        raise CaptionInputError(
            f"references must be a mapping image id -> list of captions, got {type(references).__name__}"
        )
    pred_ids, ref_ids = set(predictions), set(references)
    only_pred, only_ref = pred_ids - ref_ids, ref_ids - pred_ids
    if only_pred or only_ref:
        parts = []
        if only_pred:
            parts.append(f"{len(only_pred)} predicted image id(s) have no references: {_describe(only_pred)}")
        if only_ref:
            parts.append(f"{len(only_ref)} referenced image id(s) have no prediction: {_describe(only_ref)}")
        raise CaptionInputError("; ".join(parts))
    if not predictions:
        raise CaptionInputError("no predictions to evaluate (empty mapping)")
    ids = list(predictions)
    if len({str(i) for i in ids}) != len(ids):
        raise CaptionInputError("image ids collide when written as strings (e.g. 1 and '1'); use one id type")

    preds = {key: caption_text(predictions[key], what=f"prediction for image {key!r}") for key in ids}
    refs: dict[Hashable, list[str]] = {}
    for key in ids:
        group = references[key]
        if isinstance(group, str | bytes) or not isinstance(group, Sequence):
            raise CaptionInputError(
                f"references for image {key!r} must be a list of captions, got {type(group).__name__}"
            )
        if len(group) == 0:
            raise CaptionInputError(f"image {key!r} has no reference captions")
        refs[key] = [caption_text(ref, what=f"reference {j} of image {key!r}") for j, ref in enumerate(group)]
    return ids, preds, refs
