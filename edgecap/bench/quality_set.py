"""The fixed subset of a dataset that caption quality is measured on (:class:`QualitySet`), the same images for every
runtime/precision of a bundle."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgecap.bench.bundle_facts import bundle_input_kind

__all__ = ["QualitySet", "resolve_quality_set"]


@dataclass(frozen=True)
class QualitySet:
    """The fixed subset quality is measured on (the same images for every runtime/precision of a bundle).

    Attributes:
        description: what it is, for the report.
        image_ids: dataset image ids, in order.
        paths: image files (None entries for feature-only datasets).
        references: reference captions per image.
        features: the feature directory for bundles that caption region features, else None.
    """

    description: str
    image_ids: tuple[str, ...]
    paths: tuple[str | None, ...]
    references: tuple[tuple[str, ...], ...]
    features: str | None = None


def resolve_quality_set(
    bundle: Any, data: str | Path | None, features: str | Path | None, limit: int
) -> tuple[QualitySet | None, str]:
    """The quality subset for ``bundle``: the first ``limit`` images of the test split (val when there is none) of
    ``data``, or of the dataset the bundle was trained on when ``data`` is None and that dataset is on this machine.

    Returns:
        (the set, its description) or (None, why there is none).

    Raises:
        FileNotFoundError, ValueError: ``data``/``features`` were given explicitly but cannot be used.
    """
    from edgecap.workshop.data.datasets import load_dataset

    source = bundle.config.get("source") or {}
    explicit = data is not None
    if data is None:
        recorded = source.get("data")
        if not recorded or not Path(recorded).exists():
            return None, (
                "no quality data: the bundle's training dataset is not on this machine "
                f"({recorded or 'not recorded'}); pass --quality-data DIR"
            )
        data = recorded
    dataset = load_dataset(data)
    split = "test" if dataset.split("test") else "val"
    records = [r for r in dataset.split(split) if r.captions][:limit]
    if not records:
        message = f"quality data {data}: no test or val images with reference captions"
        if explicit:
            raise ValueError(message)
        return None, message
    feature_dir = None
    if bundle_input_kind(bundle) == "features":
        feature_dir = features or source.get("features")
        if not feature_dir or not Path(feature_dir).exists():
            message = (
                f"the bundle captions region features and no feature directory is available for {data} "
                f"({feature_dir or 'none recorded'}); pass --quality-features DIR"
            )
            if explicit or features is not None:
                raise FileNotFoundError(message)
            return None, message
    elif any(r.path is None for r in records):
        raise ValueError(f"quality data {data}: the bundle captions images but the dataset has no image files")
    quality = QualitySet(
        description=f"{split} split of {data}, first {len(records)} images",
        image_ids=tuple(r.image_id for r in records),
        paths=tuple(str(r.path) if r.path is not None else None for r in records),
        references=tuple(tuple(" ".join(c) for c in r.captions) for r in records),
        features=str(feature_dir) if feature_dir else None,
    )
    return quality, quality.description
