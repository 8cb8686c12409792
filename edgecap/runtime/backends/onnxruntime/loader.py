"""Bundles on ONNX Runtime: :func:`load_bundle_runtime`, the registry's loader for ``runtime="onnxruntime"``.

A load is planned for the provider ONNX Runtime is asked for first (precision, CPU thread plan, TensorRT options, and
the reasons), the sessions open, and the plan is checked against the providers they actually run on. ONNX Runtime
does not fail when a GPU provider cannot start: it runs on what did start, usually the CPU
(:mod:`edgecap.runtime.backends.onnxruntime.fallback`). When the provider that runs first is not the planned one, the
sessions are closed and the load is planned again for what runs (an FP16 bundle then runs FP32 or a suitable INT8
on the CPU, with the CPU's thread plan), so every reason in ``runtime_info`` describes what happens; the fallback and
its cause are in ``runtime_info["provider_fallback"]`` and one :class:`ProviderFallbackWarning` says so.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgecap.runtime.backends.onnxruntime.fallback import ProviderFallback, ProviderFallbackWarning
from edgecap.runtime.backends.onnxruntime.providers import (
    CUDA_PROVIDERS,
    auto_precision,
    cpu_can_run_int8,
    import_onnxruntime,
    resolve_providers,
    row_coupled_roles,
)
from edgecap.runtime.backends.threads import ThreadPlan, plan_threads

if TYPE_CHECKING:
    from edgecap.runtime.backends.registry import LoadedRuntime, LoadRequest
    from edgecap.runtime.bundle import Bundle

log = logging.getLogger(__name__)

__all__ = ["load_bundle_runtime"]


@dataclass
class _Plan:
    """What one opening of a bundle's sessions is given, and why."""

    providers: list[str]
    provider_reason: str
    precision: str
    precision_reason: str
    graphs: dict[str, Path]
    threads: ThreadPlan | None
    options: dict[str, Any] = field(default_factory=dict)
    coupled: list[str] = field(default_factory=list)
    tensorrt: dict[str, Any] | None = None


def load_bundle_runtime(bundle: Bundle, request: LoadRequest) -> LoadedRuntime:
    """A bundle's graphs of one precision in ONNX Runtime sessions, for ``Captioner.load(runtime="onnxruntime")``.

    Providers: TensorRT, then CUDA when this onnxruntime build has them, then CPU (or ``request.providers``).
    Precision ``"auto"``: INT8 with TensorRT when the bundle has a TensorRT-calibrated variant, FP16 on
    CUDA/TensorRT, INT8 on a CPU whose instructions suit the variant's preset, else FP32, for the provider that
    actually runs (see the module docstring). The graphs' checksums are verified before the sessions open, and their
    input/output names are checked against the bundle's interface from the sessions' own metadata.

    Returns:
        A :class:`~edgecap.runtime.backends.registry.LoadedRuntime`; its ``info`` says which provider and precision run
        and
        why, and ``provider_fallback`` (``requested``, ``in_use``, ``cause``) when a requested provider did not start.
    """
    from edgecap.runtime.backends.registry import LoadedRuntime
    from edgecap.runtime.images.inputs import image_inputs

    available = list(import_onnxruntime().get_available_providers())
    chosen = resolve_providers(request.providers, available)
    if request.providers is None:
        reason = f"{chosen[0]}: the best provider present (TensorRT, then CUDA, then CPU; available {available})"
    else:
        reason = "requested"
    plan = _plan(bundle, request, chosen, reason)
    step_model, fallback = _open(bundle, plan)
    if fallback is not None and fallback.primary_changed:
        step_model.__exit__(None, None, None)  # planned for a provider that is not running: plan for what runs
        reason = f"{fallback.in_use[0]}: ONNX Runtime fell back from {fallback.requested[0]}, which did not start"
        plan = _plan(bundle, request, list(fallback.in_use), reason)
        step_model, _ = _open(bundle, plan)
    if fallback is not None:
        warnings.warn(f"ONNX Runtime is {fallback.describe()}", ProviderFallbackWarning, stacklevel=3)
    try:
        in_use = step_model.loop_runtime.providers_in_use()
        on_gpu = in_use[0] in CUDA_PROVIDERS
        inputs, backbone, no_images = image_inputs(
            bundle, request.device or ("cuda" if on_gpu else "cpu"), bundle.backbone_in_graph
        )
    except BaseException:
        step_model.__exit__(None, None, None)
        raise
    info: dict[str, Any] = {
        "providers": in_use,
        "provider_reason": plan.provider_reason,
        "device": "cuda" if on_gpu else "cpu",
        "precision": plan.precision,
        "precision_reason": plan.precision_reason,
        "backbone": backbone,
    }
    if fallback is not None:
        info["provider_fallback"] = fallback.as_dict()
    if plan.threads is not None:
        info["threads"] = plan.threads.as_dict()
    if plan.tensorrt is not None and "TensorrtExecutionProvider" in in_use:
        info["tensorrt"] = plan.tensorrt
    if plan.precision == "int8":
        info["int8_schemes"] = {role: r["scheme"] for role, r in bundle.int8_schemes().items()}
    info["per_image_decode"] = bool(plan.coupled)
    if plan.coupled:
        info["per_image_reason"] = (
            f"the INT8 {'/'.join(plan.coupled)} graph quantises activations with one scale per call (dynamic): each "
            "image is decoded on its own, so its caption does not depend on its batch (slower on batches)"
        )
    return LoadedRuntime(step_model, inputs, info, [step_model], no_images)


def _plan(bundle: Bundle, request: LoadRequest, providers: list[str], provider_reason: str) -> _Plan:
    """Precision, threads and session options of a load on ``providers`` (the first one runs the graphs)."""
    primary = providers[0]
    precision = request.precision
    if precision == "auto":
        precision, precision_reason = auto_precision(
            bundle.precisions, primary, bundle.manifest["variants"].get("int8")
        )
    else:
        bundle.variant(precision)  # refuses, naming what the bundle holds
        precision_reason = "requested"
        if precision == "int8" and primary == "CPUExecutionProvider":
            ok, why = cpu_can_run_int8(bundle.variant("int8"))
            if not ok:
                log.warning("%s; captions may be degraded (re-export with --target cpu-auto on this machine)", why)
    if request.verify:
        bundle.verify(bundle.used_files(precision))
    graphs = {role: bundle.graph_path(precision, role) for role in bundle.interface["runtime_graphs"]}
    threads, thread_options = _thread_options(request, primary, graphs)
    plan = _Plan(providers, provider_reason, precision, precision_reason, graphs, threads)
    plan.options = {"providers": providers, "warn_fallback": False, **thread_options}
    if "TensorrtExecutionProvider" in providers:
        plan.tensorrt = _tensorrt_settings(request, bundle)
        plan.options["provider_options"] = {
            "tensorrt": _tensorrt_options(bundle, precision, plan.tensorrt["workspace_mb"])
        }
        plan.options.update(
            trt_profile_dims=bundle.interface.get("dims"),
            trt_opt_batch=plan.tensorrt["opt_batch"],
            trt_beam=plan.tensorrt["beam"],
        )
    if threads is not None and threads.decode_workers > 1 and set(graphs) == {"encoder", "step"}:
        plan.options["decode_workers"] = threads.decode_workers
    plan.coupled = row_coupled_roles(bundle.int8_schemes()) if precision == "int8" else []
    return plan


def _open(bundle: Bundle, plan: _Plan) -> tuple[Any, ProviderFallback | None]:
    """The plan's decoder, entered and checked against the bundle's interface, and the fallback when its sessions
    run without some of the planned providers (providers every session runs on count as in use)."""
    from edgecap.runtime.backends.onnxruntime.decoders import create_onnxruntime_decoder

    step_model = create_onnxruntime_decoder(
        plan.graphs,
        bundle.state_names,
        updated_state_names=bundle.updated_state_names,
        rows_independent=not plan.coupled,
        **plan.options,
    )
    step_model.__enter__()
    try:
        _check_sessions(bundle, step_model, plan.graphs)
        runtimes = (step_model.encoder, step_model.loop_runtime)
        running = [set(r.providers_in_use()) for r in runtimes]
        in_use = tuple(p for p in plan.providers if all(p in s for s in running))
    except BaseException:
        step_model.__exit__(None, None, None)
        raise
    if in_use == tuple(plan.providers):
        return step_model, None
    causes = [r.provider_fallback.cause for r in runtimes if getattr(r, "provider_fallback", None) is not None]
    cause = causes[0] if causes else "ONNX Runtime gave no reason"
    return step_model, ProviderFallback(tuple(plan.providers), in_use, cause)


def _thread_options(
    request: LoadRequest, primary: str, graphs: Mapping[str, Path]
) -> tuple[ThreadPlan | None, dict[str, Any]]:
    """The thread plan (None off the CPU) and the :class:`OnnxRuntimeSession` keyword arguments of a load request.

    On CPU the whole plan applies. On CUDA/TensorRT the CPU threads only feed the device, so the policy does not
    run; an explicit thread count >= 1 or an explicit ``spin`` still applies (an explicit value always wins).
    """
    if primary == "CPUExecutionProvider":
        plan = plan_threads(request.threads, request.spin, streams=request.streams, step_bytes=_step_bytes(graphs))
        log.info("ONNX Runtime threads: %s (%s)", plan.describe(), plan.reason)
        return plan, plan.runtime_options()
    options: dict[str, Any] = {}
    if isinstance(request.threads, int) and request.threads > 0:
        options["intra_op_threads"] = request.threads
    if request.spin is not None:
        options["session_config"] = plan_threads(
            request.threads, request.spin, streams=request.streams
        ).session_config()
    return None, options


def _step_bytes(graphs: Mapping[str, Path]) -> int:
    """Size on disk of the graph run once per token (``step`` or ``refine``): about the weights each step reads."""
    loop = next(role for role in graphs if role != "encoder")
    return Path(graphs[loop]).stat().st_size


def _check_sessions(bundle: Bundle, step_model: Any, graphs: Mapping[str, Path]) -> None:
    """Each session's input/output names against the bundle's interface (role -> session from the adapter)."""
    loop = next(role for role in graphs if role != "encoder")
    for role, runtime in (("encoder", step_model.encoder), (loop, step_model.loop_runtime)):
        bundle.check_interface(role, list(runtime.input_metadata()), runtime.output_names, graphs[role])


def _tensorrt_settings(request: LoadRequest, bundle: Bundle) -> dict[str, Any]:
    """What the TensorRT provider is tuned and bounded by (``runtime_info["tensorrt"]``): the images per call its
    profiles are tuned for, the beam the step graph's rows multiply them by (the decode's, else the bundle's), and
    the workspace limit (MiB; None = the EP's own)."""
    from edgecap.runtime.backends.onnxruntime.gpu import DEFAULT_TRT_OPT_BATCH, DEFAULT_TRT_WORKSPACE_MB

    opt_batch = request.trt_opt_batch or DEFAULT_TRT_OPT_BATCH
    asked = request.trt_workspace_mb
    workspace = DEFAULT_TRT_WORKSPACE_MB if asked is None else (int(asked) or None)  # 0: no limit of edgecap's
    beam = request.beam if request.beam is not None else getattr(bundle, "beam", None)
    return {"opt_batch": int(opt_batch), "beam": int(beam or 1), "workspace_mb": workspace}


def _tensorrt_options(bundle: Bundle, precision: str, workspace_mb: int | None) -> dict[str, Any]:
    """TensorRT EP options (:func:`edgecap.runtime.backends.onnxruntime.gpu.tensorrt_ep_options`): engine and timing
    caches in
    the bundle's hidden ``.onnxruntime-trt`` directory (outside the manifest, so it stays verifiable), keyed by the
    decoder graph's checksum; under ``$EDGECAP_HOME`` when the bundle is read-only."""
    from edgecap.runtime._home import edgecap_home
    from edgecap.runtime.backends.onnxruntime.gpu import tensorrt_cache_dir, tensorrt_ep_options
    from edgecap.runtime.engines.settings import records_2to4

    decoder_role = next(r for r in bundle.interface["runtime_graphs"] if r != "encoder")  # step or refine
    digest = bundle.manifest["files"][bundle.variant(precision)["files"][decoder_role]]["sha256"]
    cache = tensorrt_cache_dir(bundle.path, precision, digest, edgecap_home())
    cache.mkdir(parents=True, exist_ok=True)
    version = import_onnxruntime().__version__
    sparse = records_2to4(bundle.manifest)  # 2:4 sparse weights (edgecap prune --sparsity 2:4)
    return tensorrt_ep_options(cache, precision, version, workspace_mb=workspace_mb, sparsity=sparse)
