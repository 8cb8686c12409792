"""Fake quantisation that matches an INT8 preset, attached to a torch model for quantisation-aware training.

What the export's quantiser will do to a graph (``edgecap.workshop.export.calibration.presets``) is simulated in torch
with ``torch.ao.quantization.FakeQuantize``, so fine-tuning learns weights that survive it (Jacob et al. 2018, §3):

- weights: symmetric per output channel, 8 bits (7 with the preset's ``reduce_range``; a ``weight-only`` role's
  ``bits``), on every ``nn.Linear`` (the graph's ``MatMul``/``Gemm``) and ``nn.Conv2d`` (``Conv``) whose op type the
  role's policy quantises. A conv directly followed by a BatchNorm is quantised as the exporter sees it, BN folded
  in: ``fq(W·s)/s`` with ``s = γ/√(σ²+ε)`` (BatchNorm stays frozen, as in end-to-end fine-tuning);
- activations: the layer's input, per tensor, with the preset's scheme: asymmetric ``uint8`` or symmetric ``int8``.
  A ``static`` role's range is a moving average of batch min/max (what calibration estimates once); a ``dynamic``
  role's is each call's own; a ``weight-only`` role leaves activations float.

FX-graph QAT (``prepare_qat_fx``) is not used: the captioners' cached decoder steps, shared layers and
data-dependent loops do not trace symbolically; module parametrisations and forward pre-hooks need no tracing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.ao.quantization import FakeQuantize, MovingAverageMinMaxObserver, PerChannelMinMaxObserver
from torch.nn.utils import parametrize

__all__ = [
    "FakeQuantScheme",
    "attach_fake_quant",
    "fake_quantizers",
    "freeze_observers",
    "module_role",
    "remove_fake_quant",
    "scheme_for",
]

_INPUT_FQ = "input_fake_quant"
#: module id -> its input fake-quant hook, removed with the fake quantisation
_HOOKS: dict[int, Any] = {}
_OP_MODULES: dict[str, tuple[type[nn.Module], ...]] = {
    "MatMul": (nn.Linear,),
    "Gemm": (nn.Linear,),
    "Conv": (nn.Conv2d,),
}


@dataclass(frozen=True)
class FakeQuantScheme:
    """How one graph role is quantised, in torch terms.

    Attributes:
        modules: module classes whose weights (and inputs) are fake-quantised.
        weight_bits: signed symmetric weight width (8; 7 under ``reduce_range``; 4 or 8 for ``weight-only``).
        activations: ``"static"``, ``"dynamic"`` or ``"none"``.
        activation_dtype: ``"uint8"`` or ``"int8"``.
        activation_symmetric: zero point 0 (TensorRT).
    """

    modules: tuple[type[nn.Module], ...]
    weight_bits: int = 8
    activations: str = "static"
    activation_dtype: str = "uint8"
    activation_symmetric: bool = False

    def describe(self) -> dict[str, Any]:
        return {
            "modules": sorted(m.__name__ for m in self.modules),
            "weights": f"int{self.weight_bits}-symmetric-per-channel",
            "activations": "float"
            if self.activations == "none"
            else f"{self.activation_dtype}{'-symmetric' if self.activation_symmetric else ''}-{self.activations}",
        }


def scheme_for(preset: Any, role: str) -> FakeQuantScheme:
    """The fake-quant scheme of ``preset``'s policy for graph ``role`` (``"encoder"``, ``"step"``)."""
    policy = preset.role(role)
    modules = tuple({cls for op in policy.op_types for cls in _OP_MODULES.get(op, ())})
    if policy.scheme == "weight-only":
        return FakeQuantScheme(tuple(m for m in modules if m is nn.Linear), policy.bits, "none")
    return FakeQuantScheme(
        modules,
        7 if preset.reduce_range else 8,
        "dynamic" if policy.scheme == "dynamic" else "static",
        preset.activation_type,
        bool(preset.activation_symmetric),
    )


def module_role(name: str) -> str:
    """The graph a captioner's submodule is exported into: the decoder (and the word/output layers) run in the
    ``step`` graph, everything else (visual projections, encoder layers) in ``encoder``."""
    head = name.split(".", 1)[0]
    return "step" if "decoder" in head or head.startswith(("word", "embed", "generator", "out", "logit")) else "encoder"


class _WeightFakeQuant(nn.Module):
    """Parametrisation: per-channel symmetric fake quantisation of a weight, BN-folded when ``bn`` follows it."""

    def __init__(self, bits: int, bn: nn.BatchNorm2d | None) -> None:
        super().__init__()
        top = 2 ** (bits - 1) - 1
        self.fake_quant = FakeQuantize(
            observer=PerChannelMinMaxObserver,
            quant_min=-top,
            quant_max=top,
            dtype=torch.qint8,
            qscheme=torch.per_channel_symmetric,
            ch_axis=0,
        )
        self._bn = [bn] if bn is not None else []  # a list: not registered, so the BN's state is not duplicated

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        if not self._bn:
            return self.fake_quant(weight)
        bn = self._bn[0]
        var = bn.running_var if bn.running_var is not None else torch.ones_like(bn.weight)
        scale = (bn.weight / torch.sqrt(var + bn.eps)).reshape(-1, *([1] * (weight.dim() - 1)))
        return self.fake_quant(weight * scale) / scale


def _activation_fake_quant(scheme: FakeQuantScheme) -> FakeQuantize:
    symmetric = scheme.activation_symmetric
    signed = scheme.activation_dtype == "int8"
    return FakeQuantize(
        observer=MovingAverageMinMaxObserver,
        averaging_constant=1.0 if scheme.activations == "dynamic" else 0.01,
        quant_min=-127 if signed and symmetric else (-128 if signed else 0),
        quant_max=127 if signed else 255,
        dtype=torch.qint8 if signed else torch.quint8,
        qscheme=torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine,
    )


def _quantise_input(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return (getattr(module, _INPUT_FQ)(args[0]), *args[1:])


def _following_batchnorms(model: nn.Module) -> dict[int, nn.BatchNorm2d]:
    """Conv -> the BatchNorm registered right after it (timm's conv/bn pairs), by the conv's id."""
    modules = list(model.modules())
    pairs = {}
    for conv, nxt in zip(modules, modules[1:], strict=False):
        if isinstance(conv, nn.Conv2d) and isinstance(nxt, nn.BatchNorm2d) and nxt.num_features == conv.out_channels:
            pairs[id(conv)] = nxt
    return pairs


def attach_fake_quant(model: nn.Module, schemes: dict[str, FakeQuantScheme], role: str | None = None) -> int:
    """Fake-quantise ``model``'s layers in place; returns how many layers got it.

    Args:
        model: a captioner (roles by :func:`module_role`) or a backbone (pass ``role="encoder"``).
        schemes: role -> scheme (:func:`scheme_for`).
        role: one role for every layer, instead of :func:`module_role`.
    """
    folded = _following_batchnorms(model)
    count = 0
    for name, module in model.named_modules():
        scheme = schemes[role or module_role(name)]
        if not isinstance(module, scheme.modules) or parametrize.is_parametrized(module, "weight"):
            continue
        parametrize.register_parametrization(
            module, "weight", _WeightFakeQuant(scheme.weight_bits, folded.get(id(module)))
        )
        if scheme.activations != "none":
            module.add_module(_INPUT_FQ, _activation_fake_quant(scheme))
            _HOOKS[id(module)] = module.register_forward_pre_hook(_quantise_input)
        count += 1
    return count


def fake_quantizers(model: nn.Module) -> Iterator[FakeQuantize]:
    yield from (m for m in model.modules() if isinstance(m, FakeQuantize))


def freeze_observers(model: nn.Module) -> None:
    """Stop updating ranges (evaluation, or the last part of training): quantise with the ranges learnt so far."""
    for fq in fake_quantizers(model):
        fq.disable_observer()


def remove_fake_quant(model: nn.Module) -> None:
    """Undo :func:`attach_fake_quant`, keeping the weights ON the quantisation grid (``leave_parametrized``): the
    exported FP32 weights are what the fine-tuning saw, so the export's own per-channel quantisation of them
    loses (almost) nothing more."""
    for module in model.modules():
        if parametrize.is_parametrized(module, "weight"):
            parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
        if hasattr(module, _INPUT_FQ):
            delattr(module, _INPUT_FQ)
            handle = _HOOKS.pop(id(module), None)
            if handle is not None:
                handle.remove()
