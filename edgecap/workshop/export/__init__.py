"""Export: torch -> ONNX graphs per model part (fp32, fp16), validated, simplified and checked for parity.

Everything is driven by a model's :class:`ExportSpec` (``edgecap.workshop.export.spec``); nothing branches on the model
family. Every name is imported on first use (torch, ``onnx``/``onnxruntime`` only when an export or check runs), so
``import edgecap.workshop.export`` — and its calibration presets, which ``edgecap export --help`` lists — loads no
torch.

    from edgecap.workshop.export import export_onnx
    result = export_onnx(model, "out/", name="acort-xsmall")      # fp32 + fp16, parity-checked
    result.runtime_models("fp32")                                 # {"encoder": init graph, "step": step graph}
"""

from __future__ import annotations

from edgecap.runtime._lazy import lazy_dir, lazy_getattr

_LAZY: dict[str, str] = {
    **dict.fromkeys(
        (
            "DimSpec",
            "ExportSpec",
            "ExportSpecError",
            "Fp16Policy",
            "GraphSpec",
            "Tolerance",
            "get_export_spec",
            "list_export_families",
        ),
        "edgecap.workshop.export.spec",
    ),
    "ExportError": "edgecap.workshop.export.onnx",
    "ExportResult": "edgecap.workshop.export.onnx",
    "ExportedGraph": "edgecap.workshop.export.onnx",
    "export_onnx": "edgecap.workshop.export.onnx",
    "convert_to_fp16": "edgecap.workshop.export.fp16",
    "ParityError": "edgecap.workshop.export.parity",
    "check_graph": "edgecap.workshop.export.parity",
    "check_runtime": "edgecap.workshop.export.parity",
    "GraphError": "edgecap.workshop.export.graph",
    "non_portable_nodes": "edgecap.workshop.export.graph",
}

__all__ = [
    "ONNX_STACK",
    "require_onnx_stack",
    *_LAZY,
]


ONNX_STACK = ("onnx", "onnxruntime", "onnxscript", "onnxslim", "onnxconverter_common")


def require_onnx_stack() -> None:
    """Fail early, with the install command, when the export packages are missing."""
    import importlib.util

    missing = [name for name in ONNX_STACK if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"exporting needs {missing}: pip install 'edgecap[train,cpu]' (or [train,gpu])")


__getattr__ = lazy_getattr(__name__, _LAZY)
__dir__ = lazy_dir(globals(), _LAZY)
