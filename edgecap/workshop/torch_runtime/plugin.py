"""The workshop half as a plugin of the runtime: its torch runtimes and torch hooks, registered through entry points.

``pyproject.toml`` names these two functions in the ``edgecap.runtimes`` and ``edgecap.torch_hooks`` entry-point
groups; the runtime's registries call them the first time they are queried (:mod:`edgecap.runtime.plugins`). So
the runtime half never names a workshop module, and the import-graph test keeps it so.

This module imports no torch: it names its code as ``"module:attribute"`` strings, imported when a torch runtime
or hook is used. An install without torch still registers them, and asking for one says what to install.
"""

from __future__ import annotations

from edgecap.runtime.backends.registry import STEP_MODES, RuntimeSpec, register_runtime
from edgecap.runtime.precisions import FLOAT_PRECISIONS
from edgecap.runtime.torch_hooks import INSTALL, TorchHook, register_torch_hook

__all__ = ["HOOKS", "RUNTIMES", "register_hooks", "register_runtimes"]

#: The torch runtimes: the bundle's ``weights.safetensors`` decoded in torch.
RUNTIMES: tuple[RuntimeSpec, ...] = (
    RuntimeSpec(
        name="torch",
        description="torch eager: the bundle's weights.safetensors, cached step decoding (CPU or CUDA)",
        loader="edgecap.workshop.torch_runtime.loader:load_bundle_runtime",
        graph_runtime="edgecap.workshop.torch_runtime.runtime:TorchRuntime",
        requires=("torch",),
        install=INSTALL,
        precisions=FLOAT_PRECISIONS,
        auto_rank=1,
        torch=True,
        step_modes=(*STEP_MODES, "auto"),
    ),
    RuntimeSpec(
        name="torch-rerun",
        description="torch eager, re-running the whole prefix each step (the reference implementations' decoding)",
        loader="edgecap.workshop.torch_runtime.loader:load_bundle_rerun_runtime",
        requires=("torch",),
        install=INSTALL,
        precisions=FLOAT_PRECISIONS,
        baseline=True,
        torch=True,
    ),
)

#: The runtime's torch hooks (:data:`edgecap.runtime.torch_hooks.HOOK_NAMES`), every one of them.
HOOKS: tuple[TorchHook, ...] = (
    TorchHook("torch_arrays", "edgecap.workshop.torch_runtime.arrays:TORCH_OPS"),
    TorchHook("onnxruntime_binding", "edgecap.workshop.torch_runtime.onnxruntime_binding:run_bound"),
    TorchHook("backbone_inputs", "edgecap.workshop.torch_runtime.images:backbone_inputs"),
    TorchHook("captioner_from_run", "edgecap.workshop.torch_runtime.run_captioner:captioner_from_run"),
)


def register_runtimes() -> None:
    """The ``edgecap.runtimes`` entry point: register ``torch`` and ``torch-rerun``."""
    for spec in RUNTIMES:
        register_runtime(spec)


def register_hooks() -> None:
    """The ``edgecap.torch_hooks`` entry point: register the four torch hooks."""
    for hook in HOOKS:
        register_torch_hook(hook)
