"""The Swin Transformer weights inside an official ExpansionNet v2 checkpoint, renamed to timm's Swin.

The official end-to-end model keeps Microsoft's Swin code under ``swin_transf.`` (head and pooling removed). Its
names equal timm's except two things (timm's own converter for the Microsoft checkpoints does the same):

- patch merging (``downsample``) ends stage ``i`` in Microsoft's layout and starts stage ``i + 1`` in timm's, so
  ``layers.{i}.downsample.*`` becomes ``layers.{i+1}.downsample.*``;
- ``relative_position_index`` and ``attn_mask`` are saved buffers there and derived, non-persistent ones in timm; they
  follow from the window size, so they are dropped.

The result is checked name by name and shape by shape against the timm model (built on the meta device, no memory),
whose classifier head the checkpoint does not have: the backbone is rebuilt headless (``num_classes=0``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from edgecap.workshop.interop._reading import CheckpointError
from edgecap.workshop.models.state_check import state_mismatch

__all__ = ["DERIVED_BUFFERS", "official_swin_to_timm", "timm_feature_shapes"]

DERIVED_BUFFERS = ("relative_position_index", "attn_mask")
_DOWNSAMPLE = re.compile(r"^layers\.(\d+)\.downsample\.")


def timm_feature_shapes(name: str, image_size: int) -> tuple[dict[str, tuple[int, ...]], int]:
    """Names and shapes of a headless timm model's state dict, and its feature width, without allocating it."""
    import timm

    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False, num_classes=0, img_size=image_size)
    width = model.num_features  # timm's int attribute (nn.Module's __getattr__ types it Tensor | Module)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}, int(width)  # type: ignore[arg-type]


def official_swin_to_timm(
    state: Mapping[str, torch.Tensor], expected: Mapping[str, tuple[int, ...]], source: str
) -> dict[str, torch.Tensor]:
    """Rename the ``swin_transf.``-stripped official tensors to timm's names and check them against ``expected``.

    Raises:
        CheckpointError: naming missing, unexpected and mis-shaped tensors.
    """
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.rsplit(".", 1)[-1] in DERIVED_BUFFERS:
            continue
        if not value.is_floating_point():  # only the derived buffers above may be integers
            raise CheckpointError(f"{source}: Swin tensor {key!r} is {value.dtype}; weights must be floating point")
        out[_DOWNSAMPLE.sub(lambda m: f"layers.{int(m.group(1)) + 1}.downsample.", key)] = value
    problems = state_mismatch(out, expected, found_label="official")
    if problems:
        raise CheckpointError(f"{source}: the Swin weights do not fit timm's model; {problems}")
    return out
