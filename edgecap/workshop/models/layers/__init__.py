"""Building blocks of the captioning models (attention, box geometry, Transformer layers, norms, positions)."""

from __future__ import annotations

from edgecap.workshop.models.layers.attention import MASK_VALUE, MultiHeadAttention, causal_bias, mask_to_bias
from edgecap.workshop.models.layers.geometry import (
    BoxAngles,
    GeometricBias,
    box_relational_angles,
    box_relational_embedding,
    box_relational_features,
)
from edgecap.workshop.models.layers.layer_map import LayerMapError, format_layer_map, parse_layer_map
from edgecap.workshop.models.layers.norm import AnnotatedLayerNorm, make_norm
from edgecap.workshop.models.layers.position import SinusoidalPositions, TokenEmbedding, sinusoid_table
from edgecap.workshop.models.layers.transformer import (
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    LayerStack,
    TransformerDecoder,
    TransformerEncoder,
)

__all__ = [
    "MASK_VALUE",
    "AnnotatedLayerNorm",
    "BoxAngles",
    "DecoderLayer",
    "EncoderLayer",
    "FeedForward",
    "GeometricBias",
    "LayerMapError",
    "LayerStack",
    "MultiHeadAttention",
    "SinusoidalPositions",
    "TokenEmbedding",
    "TransformerDecoder",
    "TransformerEncoder",
    "box_relational_angles",
    "box_relational_embedding",
    "box_relational_features",
    "causal_bias",
    "format_layer_map",
    "mask_to_bias",
    "make_norm",
    "parse_layer_map",
    "sinusoid_table",
]
