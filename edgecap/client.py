"""``from edgecap.client import CaptionClient``: caption through a running ``edgecap serve`` (docs/serving.md).

The client half of serving, importable without torch or the server: it needs the ``[client]`` extra (tritonclient).
"""

from edgecap.runtime.serving.client import (
    AsyncCaptionClient,
    CaptionClient,
    CaptionRequestError,
    ModelNotServedError,
    ServerBusyError,
)
from edgecap.runtime.serving.protocol import CaptionReply

__all__ = [
    "AsyncCaptionClient",
    "CaptionClient",
    "CaptionReply",
    "CaptionRequestError",
    "ModelNotServedError",
    "ServerBusyError",
]
