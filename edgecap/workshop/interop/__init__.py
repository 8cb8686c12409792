"""Importing checkpoints trained with the official ACORT, ORT and ExpansionNet v2 code (``edgecap import``).

One module per source reads the official state dict safely, maps every tensor by name and shape onto the matching
reference config (``*-ref``, :mod:`edgecap.workshop.models.reference`), converts the official vocabulary and hands back
an :class:`ImportedRun`; :func:`import_checkpoint` writes it as a normal run directory. ``docs/import.md`` lists the
name mappings and where edgecap's default configs depart from the official code.
"""

from __future__ import annotations

from edgecap.runtime._lazy import lazy_dir, lazy_getattr
from edgecap.workshop.interop.sources import SOURCES

_LAZY: dict[str, str] = {
    "CheckpointError": "edgecap.workshop.interop._reading",
    "read_checkpoint": "edgecap.workshop.interop._reading",
    "read_pickle": "edgecap.workshop.interop._reading",
    "IMPORT_RECORD": "edgecap.workshop.interop._run",
    "ImportedRun": "edgecap.workshop.interop._run",
    "convert_checkpoint": "edgecap.workshop.interop.convert",
    "import_checkpoint": "edgecap.workshop.interop.convert",
    "parse_groups": "edgecap.workshop.interop.convert",
    "word_capacity": "edgecap.workshop.interop.convert",
}

__all__ = ["SOURCES", *_LAZY]

__getattr__ = lazy_getattr(__name__, _LAZY)
__dir__ = lazy_dir(globals(), _LAZY)
