"""Bundles: the unit users move around — everything ``Captioner.load(bundle)`` needs, in one directory.

A bundle is one directory::

    BUNDLE/manifest.json            format version, software versions, opset, SHA-256 of every file,
                                    per-variant parity and task-level quality
    BUNDLE/config.json              model name + overrides + sizes, vocab kind/size, backbone/preprocessing spec,
                                    decode defaults (max words, beam)
    BUNDLE/vocab.json               the vocabulary the weights were trained with
    BUNDLE/weights.safetensors      the torch weights (``Captioner.load(..., runtime="torch")``)
    BUNDLE/backbone/<file>          the backbone's local weights, when the run's features came from a file
    BUNDLE/onnx/<precision>/*.onnx  encoder, start, init (= encoder + start, what runtimes load) and step graphs
    BUNDLE/calibration/             INT8 ranges (JSON)
    BUNDLE/engines/<key>/           TensorRT engines built here by ``edgecap engine`` (derived, outside the manifest's
                                    checksums; each engine's own SHA-256 is in its ``engine.json``)

``edgecap.workshop.export.bundle.export_bundle`` (``edgecap export``) writes one atomically; ``load_bundle`` verifies
one; ``edgecap.Captioner.load(BUNDLE)`` runs one.
"""

from __future__ import annotations

from edgecap.runtime.bundle.layout import is_bundle
from edgecap.runtime.bundle.manifest import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    BundleConfigError,
    BundleError,
    BundleIntegrityError,
    BundleNotFoundError,
    BundleVersionError,
)
from edgecap.runtime.bundle.reader import Bundle, load_bundle

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "Bundle",
    "BundleConfigError",
    "BundleError",
    "BundleIntegrityError",
    "BundleNotFoundError",
    "BundleVersionError",
    "is_bundle",
    "load_bundle",
]
