"""The stages of :func:`edgecap.workshop.export.bundle.export_bundle`, one module each.

- :mod:`.request`: the export's options as one validated, frozen :class:`~.request.ExportRequest`;
- :mod:`.source`: what is exported (a run or a bundle) and where it goes by default;
- :mod:`.images`: calibration images and the encoder inputs made from images or a feature store;
- :mod:`.held_out`: the task-level check's held-out set (the run's val split, or calibration images kept out);
- :mod:`.variants`: the FP32/FP16 variants' files and the manifest records derived from the export spec;
- :mod:`.int8`: calibration, quantisation and the INT8 variant;
- :mod:`.quality`: the task-level check of each variant against the torch FP32 model;
- :mod:`.console`: stage lines and progress bars on stderr.
"""

from __future__ import annotations


class BundleExportError(ValueError):
    """An export that cannot proceed or whose checks failed; the message names the input or the failing graph."""


__all__ = ["BundleExportError"]
