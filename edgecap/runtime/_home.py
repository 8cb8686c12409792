"""Where edgecap keeps runs, bundles and engine caches: ``$EDGECAP_HOME`` or ``~/.edgecap`` (torch-free)."""

from __future__ import annotations

import os
from pathlib import Path


def edgecap_home() -> Path:
    """``$EDGECAP_HOME`` or ``~/.edgecap``."""
    return Path(os.environ.get("EDGECAP_HOME") or Path.home() / ".edgecap")
