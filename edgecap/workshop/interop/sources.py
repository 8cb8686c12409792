"""The checkpoint sources ``edgecap import`` knows, each with its importer (``"module:function"``, imported when
used): the one list the CLI's ``--from`` choices and :func:`edgecap.workshop.interop.convert.convert_checkpoint` read.
Kept free of torch so that ``edgecap import --help`` stays fast."""

from __future__ import annotations

#: Source name -> importer, called as ``importer(checkpoint, vocab, trust_pickle, **source options)``.
SOURCES: dict[str, str] = {
    "acort": "edgecap.workshop.interop.acort:import_acort",
    "ort": "edgecap.workshop.interop.ort:import_ort",
    "expansionnet-v2": "edgecap.workshop.interop.expansionnet:import_expansionnet_v2",
}
