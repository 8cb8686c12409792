"""Captioning models: the registry, the ``CaptionModel`` contract and the model families.

``create_model("acort-xsmall", vocab_size=771)`` builds a registered variant; ``list_models()`` lists them.
The backbone (timm) is imported only when ``create_backbone``/``Backbone`` is first used, and models never import
``edgecap.runtime.decoding``.
"""

from __future__ import annotations

from edgecap.runtime._lazy import lazy_dir, lazy_getattr
from edgecap.runtime.length import LENGTH_PLANS, LengthLevelError
from edgecap.workshop.models import (  # noqa: F401  (register families, variants, *-ref)
    expansionnet,
    image_transformer,
    labert,
    ort,
    reference,
)
from edgecap.workshop.models._cfg import PAPER_FEATURE_DIM, PAPER_WORD_VOCAB_SIZE, ModelCfgError
from edgecap.workshop.models._ort_cfg import ModelCfg, ObjectRelationCfg
from edgecap.workshop.models._registry import (
    EDGE_WORD_VOCAB_SIZE,
    FamilyHooks,
    UnknownModelError,
    cfg_from_dict,
    count_model_parameters,
    count_parameters,
    create_model,
    create_model_from_cfg,
    describe_models,
    edge_settings,
    family_hooks,
    get_model_cfg,
    list_families,
    list_models,
    model_family,
    paper_params,
    paper_settings,
    register_family,
    register_model,
)
from edgecap.workshop.models.base import CaptionModel, ModelInputError, State
from edgecap.workshop.models.expansionnet import ExpansionNetCaptioner, ExpansionNetCfg
from edgecap.workshop.models.image_transformer import ImageTransformerCaptioner, ImageTransformerCfg
from edgecap.workshop.models.labert import LaBertCaptioner, LaBertCfg
from edgecap.workshop.models.layers.layer_map import LayerMapError, format_layer_map, parse_layer_map
from edgecap.workshop.models.ort import ORTCaptioner

_LAZY = {"create_backbone": "edgecap.workshop.models.backbone", "Backbone": "edgecap.workshop.models.backbone"}

__all__ = [
    "EDGE_WORD_VOCAB_SIZE",
    "PAPER_FEATURE_DIM",
    "PAPER_WORD_VOCAB_SIZE",
    "LENGTH_PLANS",
    "CaptionModel",
    "ExpansionNetCaptioner",
    "ExpansionNetCfg",
    "ImageTransformerCaptioner",
    "ImageTransformerCfg",
    "FamilyHooks",
    "LaBertCaptioner",
    "LaBertCfg",
    "LayerMapError",
    "LengthLevelError",
    "ModelCfg",
    "ModelCfgError",
    "ModelInputError",
    "ObjectRelationCfg",
    "ORTCaptioner",
    "State",
    "UnknownModelError",
    "cfg_from_dict",
    "count_model_parameters",
    "count_parameters",
    "create_model",
    "create_model_from_cfg",
    "describe_models",
    "edge_settings",
    "family_hooks",
    "format_layer_map",
    "get_model_cfg",
    "list_families",
    "list_models",
    "model_family",
    "paper_params",
    "paper_settings",
    "parse_layer_map",
    "register_family",
    "register_model",
    *_LAZY,
]


__getattr__ = lazy_getattr(__name__, _LAZY)
__dir__ = lazy_dir(globals(), _LAZY)
