"""The precisions a bundle can hold, listed once: the bundle reader, export, ``Captioner.load``, the runtimes'
registry entries, ``edgecap caption`` and ``edgecap bench`` all read this tuple (torch-free, nothing imported)."""

from __future__ import annotations

__all__ = ["PRECISIONS"]

#: Every bundle precision, in the order variants are listed, exported and reported.
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "int8")
