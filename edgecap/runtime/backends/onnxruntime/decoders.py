"""One entry point from exported runtime graphs to the adapter decoding drives, chosen by the graphs' roles.

``{"encoder", "step"}`` (autoregressive captioners) becomes a
:class:`~edgecap.runtime.backends.bridge.RuntimeStepModel`;
``{"encoder", "refine"}`` (LaBERT) a :class:`~edgecap.runtime.backends.refine.RuntimeRefineModel`. Bundle export (its
task-level check) and ``Captioner.load`` both go through here, so neither knows model families.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgecap.runtime.backends.bridge import RuntimeStepModel
    from edgecap.runtime.backends.refine import RuntimeRefineModel

__all__ = ["create_onnxruntime_decoder"]


def create_onnxruntime_decoder(
    graphs: Mapping[str, Any],
    state_names: Sequence[str] | None = None,
    updated_state_names: Sequence[str] | None = None,
    *,
    rows_independent: bool = True,
    **runtime_options: Any,
) -> Any:
    """The ONNX Runtime adapter for ``graphs`` (role -> path, bytes or ``onnx.ModelProto``), a context manager.

    Args:
        graphs: ``{"encoder", "step"}`` or ``{"encoder", "refine"}``.
        state_names, updated_state_names: the step graph's state order (ignored for ``refine``, whose metadata
            carries it); None = read from the graph's metadata.
        rows_independent: False for graphs that couple a call's rows (a ``dynamic`` INT8 step): every decode on the
            adapter then runs image by image (:attr:`~edgecap.runtime.backends.bridge.GraphPair.rows_independent`).
        **runtime_options: :class:`~edgecap.runtime.backends.onnxruntime.session.OnnxRuntimeSession` options for every
        session.

    Raises:
        ValueError: the roles are neither pair.
    """
    roles = set(graphs)
    model: RuntimeStepModel | RuntimeRefineModel
    if roles == {"encoder", "refine"}:
        from edgecap.runtime.backends.onnxruntime.refine import create_onnxruntime_refine_model

        model = create_onnxruntime_refine_model(graphs["encoder"], graphs["refine"], **runtime_options)
    elif roles == {"encoder", "step"}:
        from edgecap.runtime.backends.onnxruntime.step import create_onnxruntime_step_model

        model = create_onnxruntime_step_model(
            graphs["encoder"], graphs["step"], state_names, updated_state_names=updated_state_names, **runtime_options
        )
    else:
        raise ValueError(f"runtime graphs need roles encoder + step or encoder + refine, got {sorted(roles)}")
    model.rows_independent = rows_independent
    return model
