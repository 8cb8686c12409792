"""INT8 quantisation presets per deployment target: one frozen :class:`QuantPreset` each, registered by name.

The right scheme depends on the target's integer kernels, not on the model:

- ``tensorrt``: signed INT8 activations and weights, both symmetric (zero point 0), per-channel weights, QDQ with a
  dedicated Q/DQ pair per consumer — what TensorRT's explicit quantization requires (TensorRT documentation,
  "Explicit Versus Implicit Quantization"). Weights are stored as INT8 initialisers behind a ``DequantizeLinear``
  (the DQ-only weight form TensorRT's ONNX parser and ModelOpt's ``--dq_only`` accept), so the file shrinks about 4×.
- ``cpu-avx2``: x86 without VNNI. ONNX Runtime's U8S8 kernels multiply with ``vpmaddubsw``, which saturates its
  int16 pair sums; S8S8 graphs are converted to U8S8 internally and hit the same limit. Measured on a Zen3: S8S8
  symmetric gave encoder top-1 agreement 12 % and was slower than FP32. Hence unsigned (asymmetric) activations,
  signed weights and ``reduce_range`` (7-bit weights: the pair sums can no longer overflow).
- ``cpu-vnni``: x86 with AVX512-VNNI / AVX-VNNI (Cascade Lake and later, Zen4 and later). ``vpdpbusd`` multiplies
  u8 × s8 and accumulates straight into int32, so nothing saturates: U8S8 at full 8-bit weight range, no
  ``reduce_range`` (which would only throw away one bit of weight resolution).
- ``arm64``: ARMv8.2+ ``SDOT`` / ARMv8.6 ``SMMLA`` are signed × signed int32-accumulating instructions, and
  ONNX Runtime's ARM64 QGEMM kernels take S8S8 natively, so activations and weights are both signed INT8, without
  ``reduce_range``. Activations stay asymmetric (a fitted zero point) to keep all 256 levels on one-sided tensors;
  the zero-point correction is a per-row constant the kernels fold in.
- ``cpu-auto``: ``cpu-vnni`` / ``cpu-avx2`` / ``arm64`` chosen from this machine's ``/proc/cpuinfo`` flags and
  architecture (:func:`detect_cpu_preset`). Choose a named preset when quantising for another machine.

Each graph role also has a scheme (:attr:`RolePolicy.scheme`, docs/int8.md). Every built-in preset quantises every
role with calibrated static QDQ, the decoder step included: its activation scales are fixed at export, so each row
of a call is quantised on its own and a caption never depends on which other images share its batch (a product
rule). ``dynamic`` (``quantize_dynamic``: ``DynamicQuantizeLinear`` + ``MatMulInteger``) measured within a few per
cent of static on acort-xsmall and ExpansionNet v2 but quantises a call's activations with one scale over all its
rows, so a batch's images change each other's captions; ONNX Runtime decodes a bundle with a dynamic step image by
image instead (slower on batches, ``edgecap.runtime.backends.bridge``). ``weight-only`` (``MatMulNBits``, 4 or 8 bits)
quantises activations per row and block, so it is batch-invariant too; it is an ONNX Runtime contrib op, so a
``standard_ops_only`` preset refuses it. Both are available through :meth:`QuantPreset.with_step_scheme` /
``--int8-step``.

The S8S8 presets (``tensorrt``, ``arm64``) still run on x86 ONNX Runtime, which converts them to U8S8 internally,
but slower than FP32 (acort-xsmall step graph on an AVX512-VNNI EPYC: 0.61 ms against 0.18 ms) and, without VNNI,
with saturation — they are for their targets, not for x86 CPUs.

Every preset quantises, per graph role, only ops whose integer kernels pay off and whose inputs tolerate 8 bits:
``MatMul``/``Gemm`` with constant weights (plus ``Conv`` in an encoder, for a CNN backbone). A ``Relu``/``Clip``
(ReLU6) that directly follows a ``Conv`` is folded into it: the conv's output is quantised over the activation's
range, as integer conv kernels apply it. Quantising the raw conv output instead spends most of the 256 levels on
values the ReLU6 then clips: on the quickstart's pixels-in ``acort-xsmall`` (EfficientNet-Lite0 in the encoder
graph, ``cpu-vnni``) INT8 caption agreement with FP32 rose from 35 % to 62 % with the fold. Activation×activation
matmuls (attention scores, attention × values), ``Softmax``, the additive attention mask (−1e4), the KV cache and
normalisation stay float: quantising the masked score path raised the decoder's emulated error from 0.018 to 0.82
(its scores hold ``-inf``/−1e4). Matmul *outputs* are not quantised either (TensorRT's recommended Q/DQ placement is on
op inputs, and ONNX Runtime then fuses ``DQ → MatMul`` into ``MatMulIntegerToFloat``), so logits and attention scores
leave the integer kernels in float. Calibration is MinMax by default: decoder feeds vary in batch and cache length, and
MinMax needs no histogram; Entropy/Percentile suit fixed-shape encoder feeds (the ``tensorrt`` preset's encoder).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from edgecap.runtime.backends.cpu import detect_cpu_preset
from edgecap.runtime.plugins import INT8_PRESET_GROUP, PluginLoader, claim_names
from edgecap.workshop.export.calibration.source import CalibrationError

__all__ = [
    "CALIBRATION_METHODS",
    "QuantPreset",
    "RolePolicy",
    "detect_cpu_preset",
    "get_preset",
    "list_presets",
    "load_preset_plugins",
    "register_preset",
    "resolve_preset_name",
]

#: Calibration methods by edgecap name -> ``onnxruntime.quantization.CalibrationMethod`` member.
CALIBRATION_METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}
#: Methods that build histograms of whole tensors (each feed is calibrated in its own pass, see quantize.py).
HISTOGRAM_METHODS = frozenset({"entropy", "percentile"})
#: An 8-bit integer type of activations or weights: signed or unsigned.
IntType = Literal["int8", "uint8"]
_INT_TYPES: dict[str, str] = {"int8": "QInt8", "uint8": "QUInt8"}
AUTO = "cpu-auto"
#: How a role's graph is quantised (see :class:`RolePolicy`): calibrated Q/DQ pairs, ONNX Runtime's
#: ``quantize_dynamic`` (``MatMulInteger`` behind ``DynamicQuantizeLinear``), or weight-only ``MatMulNBits``.
SCHEMES = ("static", "dynamic", "weight-only")
#: Weight widths ``MatMulNBits`` has CPU kernels for in the onnxruntime edgecap exports with.
WEIGHT_ONLY_BITS = (4, 8)
#: ``MatMulNBits`` ``accuracy_level``: 0 unset (the kernel's default), 1 fp32, 2 fp16, 3 bf16, 4 int8 compute.
ACCURACY_LEVELS = (0, 1, 2, 3, 4)
#: The schemes whose graphs hold ONNX Runtime contrib ops (``com.microsoft``), refused by ``standard_ops_only``.
CONTRIB_SCHEMES = frozenset({"weight-only"})


@dataclass(frozen=True)
class RolePolicy:
    """What gets quantised in one graph role (``"encoder"``, ``"step"``) and how it is calibrated.

    Attributes:
        op_types: op types whose inputs get Q/DQ.
        method: calibration method, a key of :data:`CALIBRATION_METHODS`.
        weight_matmuls_only: quantise only ``MatMul``/``Gemm`` nodes whose second input is a constant (weights);
            attention's activation × activation matmuls stay float. (ONNX Runtime's ``MatMulConstBOnly`` does this
            only in QOperator mode, so ``quantize_graph`` excludes those nodes by name.)
        float_output_op_types: op types whose outputs are not quantised (``OpTypesToExcludeOutputQuantization``).
        fused_activations: activation op types folded into the ``Conv`` they directly follow (the conv's output is
            quantised over the activation's range and the activation removed); the same op types anywhere else
            stay float.
        scheme: one of :data:`SCHEMES`. ``"static"``: calibrated QDQ (the only scheme TensorRT runs, and the one
            that needs calibration feeds). ``"dynamic"``: ``quantize_dynamic`` — weights INT8 per channel, activations
            quantised per call by ``DynamicQuantizeLinear`` (standard ONNX ops, CPU kernels; one scale over all
            rows of a call, so ONNX Runtime decodes such a bundle image by image). ``"weight-only"``:
            ``MatMulNBits`` — weights stored in ``bits`` bits per ``block_size`` block, the kernel quantises
            activations itself (``accuracy_level`` 4) or computes in float; an ONNX Runtime contrib op.
            Only ``MatMul`` with constant weights is quantised by the two non-static schemes.
        bits: weight width: 8 for ``static``/``dynamic``, 4 or 8 for ``weight-only``.
        block_size: ``weight-only``: weights per scale along K (a power of two >= 16).
        accuracy_level: ``weight-only``: the ``MatMulNBits`` compute type (4: INT8 activations, the fast one on CPUs;
            0 falls back to float compute, measured 5x slower than FP32 on acort-xsmall, see docs/int8.md).
    """

    op_types: tuple[str, ...]
    method: str = "minmax"
    weight_matmuls_only: bool = True
    float_output_op_types: tuple[str, ...] = ("MatMul", "Gemm")
    fused_activations: tuple[str, ...] = ()
    scheme: str = "static"
    bits: int = 8
    block_size: int = 128
    accuracy_level: int = 4

    def __post_init__(self) -> None:
        if not self.op_types:
            raise CalibrationError("RolePolicy.op_types must name at least one op type")
        if self.method not in CALIBRATION_METHODS:
            raise CalibrationError(
                f"RolePolicy.method must be one of {sorted(CALIBRATION_METHODS)}, got {self.method!r}"
            )
        if self.scheme not in SCHEMES:
            raise CalibrationError(f"RolePolicy.scheme must be one of {list(SCHEMES)}, got {self.scheme!r}")
        widths = WEIGHT_ONLY_BITS if self.scheme == "weight-only" else (8,)
        if self.bits not in widths:
            raise CalibrationError(
                f"RolePolicy.bits must be one of {list(widths)} for the {self.scheme!r} scheme, got {self.bits!r}"
            )
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise CalibrationError(f"RolePolicy.block_size must be a power of two >= 16, got {self.block_size!r}")
        if self.accuracy_level not in ACCURACY_LEVELS:
            raise CalibrationError(
                f"RolePolicy.accuracy_level must be one of {list(ACCURACY_LEVELS)}, got {self.accuracy_level!r}"
            )
        if self.scheme != "static" and "MatMul" not in self.op_types:
            raise CalibrationError(
                f"RolePolicy: the {self.scheme!r} scheme quantises MatMul weights, but op_types {list(self.op_types)} "
                "leave MatMul out"
            )

    def describe(self) -> dict[str, str | int]:
        """The scheme as a bundle manifest records it: ``scheme``, ``bits`` (and the weight-only block options)."""
        out: dict[str, str | int] = {"scheme": self.scheme, "bits": self.bits}
        if self.scheme == "weight-only":
            out.update(block_size=self.block_size, accuracy_level=self.accuracy_level)
        return out


#: The decoder step of every built-in preset: calibrated static QDQ, batch-invariant (fixed activation scales).
TRANSFORMER_ROLE = RolePolicy(op_types=("MatMul", "Gemm"))
ENCODER_ROLE = RolePolicy(op_types=("MatMul", "Gemm", "Conv"), fused_activations=("Relu", "Clip"))

#: Named step schemes (``edgecap export --int8-step NAME``): name -> :class:`RolePolicy` fields. ``static`` (every
#: preset's default) is the calibrated QDQ step; ``dynamic`` needs no calibration but is decoded image by image;
#: ``weight-only-4`` stores 4-bit weights in blocks of 32 (the smallest file, not faster than 8 bits on x86 CPUs).
STEP_SCHEMES: dict[str, dict[str, Any]] = {
    "static": {"scheme": "static"},
    "dynamic": {"scheme": "dynamic"},
    "weight-only": {"scheme": "weight-only", "bits": 8, "block_size": 128},
    "weight-only-4": {"scheme": "weight-only", "bits": 4, "block_size": 32},
}


@dataclass(frozen=True)
class QuantPreset:
    """A static-INT8 QDQ scheme for one target.

    Attributes:
        name: registry key.
        description: one line for reports and ``--help``.
        activation_type, weight_type: ``"uint8"`` or ``"int8"``.
        activation_symmetric: zero point 0 for activations (TensorRT needs it).
        weight_symmetric: zero point 0 for weights (every preset: integer kernels want it).
        per_channel: one scale per output channel of each weight.
        reduce_range: 7-bit weights, against ``vpmaddubsw`` saturation on x86 without VNNI.
        roles: graph role -> :class:`RolePolicy`; roles not listed use ``default_role``.
        default_role: the policy of any other role.
        extra_options: further ``quantize_static`` ``extra_options`` (e.g. ``DedicatedQDQPair``).
        provider: the ONNX Runtime provider family the graphs are for: ``"cpu"``, or ``"tensorrt"`` (a TensorRT
            provider picks such an INT8 variant automatically; the CPU provider never does).
        runs_on_any_cpu: the graphs compute correctly on every CPU (no instruction that saturates anywhere), so a
            CPU whose own preset differs may still run them (``cpu-avx2``: 7-bit weights).
        standard_ops_only: refuse QDQ graphs with ONNX Runtime's contrib ops (the target's parser rejects them).
    """

    name: str
    description: str
    activation_type: IntType
    weight_type: IntType = "int8"
    activation_symmetric: bool = False
    weight_symmetric: bool = True
    per_channel: bool = True
    reduce_range: bool = False
    roles: Mapping[str, RolePolicy] = field(default_factory=lambda: {"encoder": ENCODER_ROLE, "step": TRANSFORMER_ROLE})
    default_role: RolePolicy = TRANSFORMER_ROLE
    extra_options: Mapping[str, Any] = field(default_factory=dict)
    provider: str = "cpu"
    runs_on_any_cpu: bool = False
    standard_ops_only: bool = False

    def __post_init__(self) -> None:
        for label in ("activation_type", "weight_type"):
            if getattr(self, label) not in _INT_TYPES:
                raise CalibrationError(f"preset {self.name!r}: {label} must be one of {sorted(_INT_TYPES)}")
        policies = {**self.roles, "(default)": self.default_role}
        for role, policy in policies.items():
            if self.standard_ops_only and policy.scheme in CONTRIB_SCHEMES:
                raise CalibrationError(
                    f"preset {self.name!r}: role {role!r} uses the {policy.scheme!r} scheme (ONNX Runtime contrib op "
                    "MatMulNBits), but the preset allows standard ONNX ops only; use 'static' or 'dynamic'"
                )
            if self.provider == "tensorrt" and policy.scheme != "static":
                raise CalibrationError(
                    f"preset {self.name!r}: role {role!r} uses the {policy.scheme!r} scheme, but TensorRT runs only "
                    "static Q/DQ INT8 (explicit quantization)"
                )

    def with_step_scheme(self, name: str, role: str = "step") -> QuantPreset:
        """A copy whose decoder loop ``role`` uses the named scheme of :data:`STEP_SCHEMES`.

        Raises:
            CalibrationError: an unknown name, or a scheme the preset's target cannot run.
        """
        if name not in STEP_SCHEMES:
            raise CalibrationError(f"unknown INT8 step scheme {name!r}; choose one of {list(STEP_SCHEMES)}")
        options = dict(STEP_SCHEMES[name])
        return self.with_scheme(role, options.pop("scheme"), **options)

    def with_scheme(self, role: str, scheme: str, **options: Any) -> QuantPreset:
        """A copy whose ``role`` is quantised with ``scheme`` (``bits`` etc. in ``options``; weight-only defaults to
        8 bits), the rest unchanged — e.g. ``get_preset("cpu-vnni").with_scheme("step", "static")``."""
        policy = dataclasses.replace(self.role(role), scheme=scheme, **{"bits": 8, **options})
        return self.replace(roles={**self.roles, role: policy})

    def role(self, role: str) -> RolePolicy:
        """The policy of graph role ``role``."""
        return self.roles.get(role, self.default_role)

    def replace(self, **changes: Any) -> QuantPreset:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def quantize_kwargs(self, policy: RolePolicy) -> dict[str, Any]:
        """Keyword arguments of ``onnxruntime.quantization.quantize_static`` for a graph quantised with ``policy``
        (without model paths, reader, node lists and cache path). Imports onnxruntime."""
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType

        extra = {
            "ActivationSymmetric": self.activation_symmetric,
            "WeightSymmetric": self.weight_symmetric,
            "OpTypesToExcludeOutputQuantization": list(policy.float_output_op_types),
            # a MatMul weight (K, N) has its output channels on axis 1 (ONNX Runtime's default, stated for clarity)
            "QDQOpTypePerChannelSupportToAxis": {"MatMul": 1},
            **dict(self.extra_options),
        }
        return {
            "quant_format": QuantFormat.QDQ,
            "op_types_to_quantize": [*policy.op_types, *policy.fused_activations],
            "per_channel": self.per_channel,
            "reduce_range": self.reduce_range,
            "activation_type": getattr(QuantType, _INT_TYPES[self.activation_type]),
            "weight_type": getattr(QuantType, _INT_TYPES[self.weight_type]),
            "calibrate_method": getattr(CalibrationMethod, CALIBRATION_METHODS[policy.method]),
            "extra_options": extra,
        }

    def summary(self) -> dict[str, Any]:
        """JSON-ready description (recorded in :class:`~edgecap.workshop.export.calibration.quantize.Int8Result`)."""
        return {
            "name": self.name,
            "activation_type": self.activation_type,
            "weight_type": self.weight_type,
            "activation_symmetric": self.activation_symmetric,
            "weight_symmetric": self.weight_symmetric,
            "per_channel": self.per_channel,
            "reduce_range": self.reduce_range,
            "roles": {role: dataclasses.asdict(policy) for role, policy in self.roles.items()},
            "schemes": {role: policy.describe() for role, policy in self.roles.items()},
            "extra_options": dict(self.extra_options),
            **self.deployment(),
            "standard_ops_only": self.standard_ops_only,
        }

    def deployment(self) -> dict[str, Any]:
        """Where the graphs may run, as a bundle's INT8 variant records it (runtimes read this, not the name)."""
        return {"provider": self.provider, "runs_on_any_cpu": self.runs_on_any_cpu}


# -- registry --------------------------------------------------------------------------------------------------------
_PRESETS: dict[str, QuantPreset] = {}
#: Preset name -> the plugin that registered it (names absent here are edgecap's own).
_PLUGIN_NAMES: dict[str, str] = {}


def register_preset(preset: QuantPreset) -> QuantPreset:
    """Register ``preset`` under ``preset.name`` (replacing an existing one); returns it.

    Raises:
        edgecap.runtime.plugins.PluginError: called while an entry-point plugin loads, with a name already registered (a
            plugin never silently replaces a built-in preset).
    """
    if not isinstance(preset, QuantPreset):
        raise TypeError(f"register_preset takes a QuantPreset, got {type(preset).__name__}")
    claim_names("INT8 preset", (preset.name,), _taken_preset, _PLUGIN_NAMES)  # AUTO reads as a built-in
    if preset.name == AUTO:
        raise CalibrationError(f"{AUTO!r} is reserved: it resolves to a registered CPU preset")
    _PRESETS[preset.name] = preset
    return preset


def _taken_preset(name: str) -> str | None:
    """``name`` when a preset (or ``cpu-auto``, which edgecap reserves) already holds it, None when free."""
    return name if name in _PRESETS or name == AUTO else None


_PLUGINS = PluginLoader(INT8_PRESET_GROUP, QuantPreset, register_preset)


def load_preset_plugins() -> None:
    """Register the presets of installed plugins (the ``edgecap.int8_presets`` entry points), once; every query of
    the registry calls this, so a plugin's preset is there without any import in the user's code.

    Raises:
        edgecap.runtime.plugins.PluginError: a plugin's preset name clashes with one already registered.
    """
    _PLUGINS.ensure_loaded()


def list_presets() -> list[str]:
    """Registered preset names plus ``cpu-auto``."""
    load_preset_plugins()
    return sorted([*_PRESETS, AUTO])


def resolve_preset_name(name: str) -> str:
    """``name`` itself, or for ``cpu-auto`` the CPU preset this machine needs."""
    return detect_cpu_preset() if name == AUTO else name


def get_preset(preset: str | QuantPreset) -> QuantPreset:
    """The preset called ``preset`` (``cpu-auto`` resolved for this machine), or ``preset`` itself.

    Raises:
        CalibrationError: unknown name.
    """
    if isinstance(preset, QuantPreset):
        return preset
    load_preset_plugins()
    name = resolve_preset_name(preset)
    try:
        return _PRESETS[name]
    except KeyError:
        raise CalibrationError(f"unknown INT8 preset {preset!r}; choose one of {list_presets()}") from None


# -- built-in presets ------------------------------------------------------------------------------------------------
register_preset(
    QuantPreset(
        name="tensorrt",
        description="TensorRT explicit quantization: S8S8 symmetric, per-channel weights, dedicated Q/DQ pairs",
        activation_type="int8",
        activation_symmetric=True,
        roles={"encoder": dataclasses.replace(ENCODER_ROLE, method="entropy"), "step": TRANSFORMER_ROLE},
        extra_options={"DedicatedQDQPair": True},
        provider="tensorrt",
        standard_ops_only=True,
    )
)
register_preset(
    QuantPreset(
        name="cpu-avx2",
        description="x86 without VNNI (ONNX Runtime CPU): U8S8, 7-bit weights (reduce_range), per-channel",
        activation_type="uint8",
        reduce_range=True,
        runs_on_any_cpu=True,
    )
)
register_preset(
    QuantPreset(
        name="cpu-vnni",
        description="x86 with AVX512-VNNI/AVX-VNNI (ONNX Runtime CPU): U8S8, full-range weights, per-channel",
        activation_type="uint8",
    )
)
register_preset(
    QuantPreset(
        name="arm64",
        description="64-bit ARM with SDOT/I8MM (ONNX Runtime CPU): S8S8, asymmetric activations, per-channel",
        activation_type="int8",
    )
)
