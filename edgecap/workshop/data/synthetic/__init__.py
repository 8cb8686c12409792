"""Synthetic scene captioning: the built-in dataset and quality benchmark of edgecap.

Images show 1-4 coloured shapes on textured, noisy backgrounds; every image has several true reference captions
(exact counts, spatial relations, positions, background) spread over the LaBERT length levels. Units:

* :func:`sample_scene` - the ground truth (:class:`Scene`);
* :func:`render_scene` - pixels;
* :func:`describe_scene` - captions;
* :func:`generate_dataset` - a Karpathy-format dataset directory;
* :func:`dataset_stats` - statistics of any Karpathy-format dataset.
"""

from __future__ import annotations

from edgecap.workshop.data.synthetic._attributes import BACKGROUNDS, COLOURS, SHAPES, SIZES
from edgecap.workshop.data.synthetic._geometry import is_next_to, position_region, spatial_relation
from edgecap.workshop.data.synthetic._grammar import LENGTH_LEVELS, MAX_CAPTION_WORDS, describe_scene, length_level
from edgecap.workshop.data.synthetic._render import render_scene
from edgecap.workshop.data.synthetic._scene import Background, Scene, SceneError, SceneObject, sample_scene
from edgecap.workshop.data.synthetic._stats import dataset_stats
from edgecap.workshop.data.synthetic._writer import SynthError, generate_dataset, split_counts

__all__ = [
    "BACKGROUNDS",
    "COLOURS",
    "LENGTH_LEVELS",
    "MAX_CAPTION_WORDS",
    "SHAPES",
    "SIZES",
    "Background",
    "Scene",
    "SceneError",
    "SceneObject",
    "SynthError",
    "dataset_stats",
    "describe_scene",
    "generate_dataset",
    "is_next_to",
    "length_level",
    "position_region",
    "render_scene",
    "sample_scene",
    "spatial_relation",
    "split_counts",
]
