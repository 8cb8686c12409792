"""Opening a visual feature source by path: a backbone feature cache or bottom-up region features."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def open_feature_source(path: str | Path) -> Any:
    """A :class:`FeatureCache` when ``path`` holds one (``meta.json``), else a :class:`RegionFeatureStore`."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"feature directory not found: {path} (create it with `edgecap features --data DIR`)")
    if (path / "meta.json").is_file():
        from edgecap.workshop.data.feature_cache import FeatureCache

        return FeatureCache(path)
    from edgecap.workshop.data.region_features import RegionFeatureStore

    return RegionFeatureStore(path)
