"""The checkpoint sources ``edgecap import`` knows, each with its importer (``"module:function"``, imported when
used): the one list the CLI's ``--from`` choices and :func:`edgecap.interop.convert.convert_checkpoint` read. Kept
free of torch so that ``edgecap import --help`` stays fast."""

from __future__ import annotations

#: Source name -> importer, called as ``importer(checkpoint, vocab, trust_pickle, **source options)``.
SOURCES: dict[str, str] = {
    "acort": "edgecap.interop.acort:import_acort",
    "ort": "edgecap.interop.ort:import_ort",
    "expansionnet-v2": "edgecap.interop.expansionnet:import_expansionnet_v2",
}
