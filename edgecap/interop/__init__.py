"""Importing checkpoints trained with the official ACORT, ORT and ExpansionNet v2 code (``edgecap import``).

One module per source reads the official state dict safely, maps every tensor by name and shape onto the matching
reference config (``*-ref``, :mod:`edgecap.models.reference`), converts the official vocabulary and hands back an
:class:`ImportedRun`; :func:`import_checkpoint` writes it as a normal run directory. ``docs/import.md`` lists the
name mappings and where edgecap's default configs depart from the official code.
"""

from __future__ import annotations

from edgecap._lazy import lazy_getattr
from edgecap.interop.sources import SOURCES

_LAZY: dict[str, str] = {
    "CheckpointError": "edgecap.interop._reading",
    "read_checkpoint": "edgecap.interop._reading",
    "read_pickle": "edgecap.interop._reading",
    "IMPORT_RECORD": "edgecap.interop._run",
    "ImportedRun": "edgecap.interop._run",
    "convert_checkpoint": "edgecap.interop.convert",
    "import_checkpoint": "edgecap.interop.convert",
    "parse_groups": "edgecap.interop.convert",
    "word_capacity": "edgecap.interop.convert",
}

__all__ = ["SOURCES", *_LAZY]

__getattr__ = lazy_getattr(__name__, _LAZY)
