"""Which ONNX Runtime execution providers a session asks for, and which bundle precision suits the provider that runs.

One table, :data:`PROVIDERS`, says what edgecap knows of each provider (device, short names, the precisions
``precision="auto"`` prefers, whether an INT8 variant suits it); :func:`resolve_providers` turns a request into
ONNX Runtime's provider list and :func:`auto_precision` picks a bundle variant for the provider that runs. Plain
Python: nothing here creates a session, so the choices are tested on any machine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgecap.runtime._versions import InvalidVersion, release

__all__ = [
    "CUDA_PROVIDERS",
    "PROVIDERS",
    "PROVIDER_ALIASES",
    "ROW_COUPLED_SCHEMES",
    "SCHEME_MIN_ONNXRUNTIME",
    "OnnxRuntimeProviderError",
    "ProviderInfo",
    "auto_precision",
    "cpu_can_run_int8",
    "import_onnxruntime",
    "provider_info",
    "provider_label",
    "resolve_providers",
    "row_coupled_roles",
]


@dataclass(frozen=True)
class ProviderInfo:
    """What edgecap knows about one execution provider; provider and precision choice read this table, so supporting
    another provider is one entry in :data:`PROVIDERS`.

    Attributes:
        name: onnxruntime's name (``"CUDAExecutionProvider"``).
        label: how reasons and reports name it.
        aliases: short names accepted in ``providers=``.
        device: where its tensors live (``"cuda"`` or ``"cpu"``).
        auto: tried automatically when this onnxruntime build has it (CPU is always appended as the fallback).
        precisions: what ``precision="auto"`` takes on it, best first, among the variants the bundle holds.
        int8_suits: ``(INT8 variant entry) -> (runs correctly here, why)``; None = INT8 is never chosen on it.
        library: the shared library onnxruntime loads for it (``libonnxruntime_providers_<library>.so``), None when
            it is built in; a fallback's cause is read from that library's load error.
    """

    name: str
    label: str
    aliases: tuple[str, ...]
    device: str
    auto: bool
    precisions: tuple[str, ...]
    int8_suits: Callable[[Mapping[str, Any]], tuple[bool, str]] | None = None
    library: str | None = None


class OnnxRuntimeProviderError(ValueError):
    """An execution provider that is unknown or not available in this onnxruntime build."""


def import_onnxruntime() -> Any:
    """``onnxruntime``, or an ImportError that says what to install (the registered runtime's own install text)."""
    try:
        import onnxruntime
    except ImportError as exc:
        from edgecap.runtime.backends.registry import get_runtime

        raise ImportError(f"the 'onnxruntime' runtime needs onnxruntime: {get_runtime('onnxruntime').install}") from exc
    return onnxruntime


def resolve_providers(requested: Sequence[str] | str | None, available: Sequence[str]) -> list[str]:
    """The provider list a session gets.

    Args:
        requested: None = automatic (TensorRT, CUDA when available, then CPU); otherwise names or aliases
            (``"cpu"``, ``"cuda"``, ``"tensorrt"``/``"trt"``) in priority order. CPU is appended when missing.
        available: ``onnxruntime.get_available_providers()``.

    Raises:
        OnnxRuntimeProviderError: a requested provider is unknown or not available here.
    """
    if requested is None:
        chosen = [p for p in _AUTO_PROVIDERS if p in available]
    else:
        names = [requested] if isinstance(requested, str) else list(requested)
        chosen = [PROVIDER_ALIASES.get(str(p).lower(), str(p)) for p in names]
        missing = [p for p in chosen if p not in available]
        if missing:
            raise OnnxRuntimeProviderError(
                f"execution provider(s) {missing} are not available in this onnxruntime build "
                f"(available: {list(available)}); install onnxruntime-gpu for CUDA/TensorRT"
            )
    chosen = list(dict.fromkeys(chosen))
    if "CPUExecutionProvider" not in chosen:
        chosen.append("CPUExecutionProvider")
    return chosen


def provider_label(name: str) -> str:
    """The short name reasons use (``"TensorRT"``), or onnxruntime's own for a provider outside the table."""
    info = _BY_NAME.get(name)
    return info.label if info is not None else name


def _deployment(variant: Mapping[str, Any]) -> Mapping[str, Any]:
    """Where the INT8 variant's graphs may run, as its preset recorded it at export (``provider``,
    ``runs_on_any_cpu``); bundles exported before that record get the built-in presets' values by name."""
    recorded = variant.get("deployment")
    if isinstance(recorded, Mapping):
        return recorded
    preset = str(variant.get("preset") or variant.get("target") or "")
    return {"provider": "tensorrt" if preset == "tensorrt" else "cpu", "runs_on_any_cpu": preset == "cpu-avx2"}


#: INT8 schemes whose graphs quantise a call's activations with one scale over all its rows (``dynamic``:
#: ``DynamicQuantizeLinear``), so a row's output depends on the call's other rows. ``static`` scales are fixed at
#: export and ``weight-only`` (``MatMulNBits``) quantises each row's blocks on their own.
ROW_COUPLED_SCHEMES = frozenset({"dynamic"})


def row_coupled_roles(schemes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The roles whose INT8 scheme record (a manifest's ``schemes``) couples a call's rows
    (:data:`ROW_COUPLED_SCHEMES`); a per-image decode runs the encoder and the loop graph image by image."""
    return [r for r in sorted(schemes) if schemes[r].get("scheme") in ROW_COUPLED_SCHEMES]


#: (step scheme, bits) -> the first onnxruntime release with CPU kernels for its ops (8-bit ``MatMulNBits``: 1.22).
SCHEME_MIN_ONNXRUNTIME: dict[tuple[object, object], tuple[int, int]] = {("weight-only", 8): (1, 22)}


def _onnxruntime_too_old_for(variant: Mapping[str, Any]) -> str | None:
    """Why this onnxruntime cannot run the INT8 variant's recorded schemes, or None when it can."""
    installed = import_onnxruntime().__version__
    try:
        version = release(installed, 2)
    except InvalidVersion:
        version = ()  # unreadable: every recorded minimum reads as unmet, and the message shows the string
    for role, record in (variant.get("schemes") or {}).items():
        if not isinstance(record, Mapping):
            continue
        need = SCHEME_MIN_ONNXRUNTIME.get((record.get("scheme"), record.get("bits")))
        if need and version < need:
            return (
                f"the INT8 {role} graph is {record.get('bits')}-bit {record.get('scheme')}, which needs onnxruntime >= "
                f"{need[0]}.{need[1]} (installed: {installed})"
            )
    return None


def cpu_can_run_int8(variant: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether this CPU runs the INT8 variant's preset correctly: a preset built for VNNI (no ``reduce_range``) or for
    ARM (S8S8) saturates on a CPU without those instructions, and a TensorRT (S8S8 symmetric) graph likewise; a
    preset that records ``runs_on_any_cpu`` (``cpu-avx2``) is safe everywhere."""
    from edgecap.runtime.backends.cpu import detect_cpu_preset

    too_old = _onnxruntime_too_old_for(variant)
    if too_old:
        return False, too_old
    preset = str(variant.get("preset") or variant.get("target") or "")
    here = detect_cpu_preset()
    deployment = _deployment(variant)
    if preset == here or (deployment.get("provider") == "cpu" and deployment.get("runs_on_any_cpu")):
        return True, f"INT8 preset {preset} suits this CPU ({here})"
    return False, f"the INT8 variant was quantised for {preset}, this CPU needs {here}"


def _tensorrt_int8(variant: Mapping[str, Any]) -> tuple[bool, str]:
    """TensorRT runs an INT8 variant whose preset records TensorRT as its provider (symmetric S8S8 QDQ)."""
    if _deployment(variant).get("provider") == "tensorrt":
        return True, "TensorRT with an INT8 variant calibrated for TensorRT"
    return False, f"the INT8 variant was quantised for {variant.get('preset') or variant.get('target')}, not TensorRT"


#: The execution providers edgecap chooses among, best first. FP16 is left out on CPU: ONNX Runtime's CPU provider
#: runs FP16 graphs through inserted casts, slower than FP32.
PROVIDERS: tuple[ProviderInfo, ...] = (
    ProviderInfo(
        "TensorrtExecutionProvider",
        "TensorRT",
        ("tensorrt", "trt"),
        "cuda",
        True,
        ("int8", "fp16"),
        _tensorrt_int8,
        library="tensorrt",
    ),
    ProviderInfo("CUDAExecutionProvider", "CUDA", ("cuda",), "cuda", True, ("fp16",), library="cuda"),
    ProviderInfo("CPUExecutionProvider", "CPU", ("cpu",), "cpu", False, ("int8",), cpu_can_run_int8),
)
_BY_NAME = {p.name: p for p in PROVIDERS}
#: Short names accepted in ``providers=``.
PROVIDER_ALIASES = {alias: p.name for p in PROVIDERS for alias in p.aliases}
#: Providers preferred when present, best first; CPU is always appended.
_AUTO_PROVIDERS = tuple(p.name for p in PROVIDERS if p.auto)
#: Providers whose tensors live on a CUDA device.
CUDA_PROVIDERS = frozenset(p.name for p in PROVIDERS if p.device == "cuda")


def provider_info(name: str) -> ProviderInfo | None:
    """The table's entry for ``name``, or None for a provider edgecap has no entry for."""
    return _BY_NAME.get(name)


def auto_precision(available: Sequence[str], provider: str, int8: Mapping[str, Any] | None) -> tuple[str, str]:
    """The best precision of a bundle for ONNX Runtime's first provider, with the reason: the first of the provider's
    :attr:`ProviderInfo.precisions` the bundle holds (INT8 only when the variant suits the provider), else FP32."""
    info = _BY_NAME.get(provider)
    if info is None:
        return "fp32", f"{provider}: FP32 (edgecap has no precision preference for this provider)"
    passed = []
    for precision in info.precisions:
        if precision == "int8":
            if int8 is None or info.int8_suits is None:
                passed.append("the bundle has no INT8 variant")
                continue
            ok, why = info.int8_suits(int8)
            if ok:
                return "int8", why
            passed.append(why)
        elif precision in available:
            return precision, f"{info.label}: {precision.upper()} graphs"
        else:
            passed.append(f"the bundle has no {precision.upper()} variant")
    return "fp32", f"{info.label}: FP32 ({'; '.join(passed) or 'its preferred precision'})"
