"""Random-weights models on a grid of random features: what the decoding and kernel studies time when the question
is the cost of a model's shape, not its captions (``python research/decode_cache.py``, the GPU check's default).

Weights are seeded (``torch.manual_seed``) and the features are a 7 × 7 grid of ReLU6-like values, the layout
EfficientNet-Lite0 gives at 224 px, so two processes with the same seed decode the same tokens.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgecap.runtime.backends.cpu import cpu_model
from edgecap.runtime.decoding import DecodeCfg, RadixSpec

if TYPE_CHECKING:
    from torch import Tensor, nn

# torch and the models are imported by the functions that use them: importing this module stays torch-free.

GRID = 7  # EfficientNet-Lite0 at 224 px: a 7 x 7 grid of 1280-d features (49 regions)


def _edge_settings(name: str) -> dict[str, Any]:
    from edgecap.workshop.models import edge_settings

    return edge_settings(name)


def _paper_settings(name: str) -> dict[str, Any]:
    from edgecap.workshop.models import paper_settings

    return paper_settings(name)


#: ``create_model`` arguments by setting name: edgecap's edge setting or the paper's (``edgecap.workshop.models``).
SETTINGS = {"edge": _edge_settings, "paper": _paper_settings}


def _words(setting: str) -> int:
    from edgecap.workshop.models import EDGE_WORD_VOCAB_SIZE, PAPER_WORD_VOCAB_SIZE

    return {"edge": EDGE_WORD_VOCAB_SIZE, "paper": PAPER_WORD_VOCAB_SIZE}[setting]


@dataclass
class Setup:
    """A model, its base DecodeCfg (token ids, radix layout) and the input batches the timed calls cycle through."""

    model: nn.Module
    decode_cfg: DecodeCfg
    batches: list[dict[str, Tensor]]
    name: str
    weights: str


def random_setup(name: str, batch: int, seed: int, setting: str = "edge") -> Setup:
    """Random-init ``name`` + one batch of a 7x7 grid of features. ``setting="edge"``: 1280-d features, radix 771
    classes / 124-id word vocab; ``"paper"``: the paper's feature dim and 10,001-word vocabulary (radix models spell
    those words in base-768 digits, two per word)."""
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {sorted(SETTINGS)}, got {setting!r}")
    import torch

    from edgecap.workshop.models import create_model, get_model_cfg

    torch.manual_seed(seed)
    settings = SETTINGS[setting](name)
    model = create_model(name, **settings).eval()
    cfg = get_model_cfg(name)
    if cfg.vocab_kind == "radix":
        # The edge vocabulary (120 words + <unk>) fits one base-768 digit, as for the synthetic/COCO-small runs.
        words = _words(setting) - 3
        base = cfg.radix_base
        digits = 1
        while base**digits < words:
            digits += 1
        decode_cfg = DecodeCfg(pad_id=0, bos_id=base + 1, eos_id=base + 2, radix=RadixSpec(base, digits, words))
        vocab = f"radix {settings['vocab_size']} classes ({words} words)"
    else:
        decode_cfg = DecodeCfg(pad_id=0, bos_id=1, eos_id=2)
        vocab = f"word {settings['vocab_size']} ids"
    return Setup(model, decode_cfg, [grid_inputs(batch, settings["feature_dim"], seed)], name, f"random init, {vocab}")


def grid_inputs(batch: int, feature_dim: int, seed: int) -> dict[str, Tensor]:
    """A batch of random ReLU6-like features on a 7x7 grid, with the grid cells as boxes and every region valid."""
    import torch

    g = torch.Generator().manual_seed(seed)
    regions = GRID * GRID
    features = torch.randn(batch, regions, feature_dim, generator=g).clamp_(0, 6)  # ReLU6-like
    cells = torch.arange(GRID, dtype=torch.float32) / GRID
    y, x = torch.meshgrid(cells, cells, indexing="ij")
    boxes = torch.stack([x, y, x + 1 / GRID, y + 1 / GRID], dim=-1).reshape(1, regions, 4).expand(batch, -1, -1)
    mask = torch.ones(batch, regions, dtype=torch.bool)
    return {"features": features, "boxes": boxes.contiguous(), "feature_mask": mask}


def torch_environment() -> dict[str, Any]:
    """What the numbers depend on: torch, threads, CPU, and the machine's load when measuring."""
    import torch

    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
