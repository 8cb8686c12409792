"""The precisions a bundle can hold, listed once: the bundle reader, export, ``Captioner.load``, the runtimes'
registry entries, ``edgecap caption`` and ``edgecap bench`` all read these tuples (torch-free, nothing imported)."""

from __future__ import annotations

__all__ = ["FLOAT_PRECISIONS", "PRECISIONS"]

#: Every bundle precision, in the order variants are listed, exported and reported.
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "int8")

#: The precisions a graph or a weight file is written in directly; INT8 is derived from the FP32 graph by
#: quantisation (``edgecap.workshop.export.calibration``), so the exporters and the torch runtimes take only these.
FLOAT_PRECISIONS: tuple[str, ...] = tuple(p for p in PRECISIONS if p != "int8")
