"""The runtime roles of exported graphs per decoding kind (torch-free: the bundle reader checks manifests with it).

- ``autoregressive``: ``encoder`` (decode inputs -> initial state) and ``step`` (one token per hypothesis);
- ``mask_predict`` (LaBERT): ``encoder`` (visual inputs -> state) and ``refine`` (a whole caption per pass).
"""

from __future__ import annotations

__all__ = ["DECODING_ROLES"]

DECODING_ROLES: dict[str, tuple[str, ...]] = {
    "autoregressive": ("encoder", "step"),
    "mask_predict": ("encoder", "refine"),
}
