"""``build_engines``: TensorRT engines from a bundle's own graphs, stored in the bundle (``edgecap engine``).

Per runtime role (``init``/``step`` or ``encoder``/``refine``) the ONNX graph of the requested precision is parsed
with TensorRT's ONNX parser into a network created with the flags
:func:`~edgecap.runtime.engines.settings.build_settings`
chooses for the installed TensorRT, with one optimisation profile from the bundle's dynamic axes
(:mod:`edgecap.runtime.engines.profiles`), a workspace limit and the key's timing cache. Autoregressive bundles also get
two gather engines written with TensorRT's network API (``add_gather`` on axis 0): ``reorder`` gathers the states the
step updates by a row index (beam reordering, every step a beam changes), ``expand`` gathers every state (images to
beams, and any reorder that changes a carried state), so beam search never copies a cache through the host.

The set is written atomically into ``BUNDLE/engines/<key>/`` (:mod:`edgecap.runtime.engines.store`); an up-to-date set
is
kept unless ``rebuild``. Every TensorRT call of the build is in :mod:`edgecap.runtime.engines.tensorrt_api`; tensorrt
and
cuda-python are imported only when a build or the runtime runs.
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgecap._version import __version__
from edgecap.runtime._io import atomic_directory, atomic_write_bytes
from edgecap.runtime.backends.base import TensorMeta
from edgecap.runtime.engines import tensorrt_api
from edgecap.runtime.engines.graphs import GraphIO, read_graph_io
from edgecap.runtime.engines.profiles import EngineProfile, ProfileRequest, graph_profile
from edgecap.runtime.engines.settings import SPARSE_WEIGHTS, build_settings, records_2to4, with_sparse_weights
from edgecap.runtime.engines.store import (
    ENGINES_DIR,
    RECORD_FORMAT,
    RECORD_NAME,
    RECORD_VERSION,
    EngineEnv,
    EngineRecordError,
    check_record,
    engine_file,
    engine_key,
    read_record,
    verify_plans,
)
from edgecap.runtime.engines.tensorrt_api import (
    TRT_INSTALL,
    EngineBuildError,
    EngineUnavailableError,
    check_dtypes,
    load_tensorrt,
)

log = logging.getLogger(__name__)

__all__ = [
    "TRT_INSTALL",
    "EngineBuildError",
    "EngineUnavailableError",
    "EngineSet",
    "build_engines",
    "current_env",
    "gather_profile",
    "load_tensorrt",
    "plan_graphs",
]

TIMING_CACHE = "timing.cache"
#: The gather engines of an autoregressive set: which states each gathers.
GATHERS = ("reorder", "expand")


def current_env(trt: Any, device: int = 0) -> EngineEnv:
    """This machine's TensorRT version and GPU (the engine key's environment part).

    Raises:
        EngineUnavailableError: no cuda-python or no CUDA GPU.
    """
    from edgecap.runtime.engines.cuda import CudaUnavailableError, gpu_info

    try:
        gpu = gpu_info(device)
    except CudaUnavailableError as exc:
        raise EngineUnavailableError(f"TensorRT engines need a CUDA GPU: {exc}") from None
    return EngineEnv(str(trt.__version__), gpu.name, gpu.compute_capability)


@dataclass(frozen=True)
class EngineSet:
    """A built (or kept) engine set: its folder, record and whether this call built it."""

    folder: Path
    record: dict[str, Any]
    built: bool


@dataclass(frozen=True)
class _Graph:
    role: str
    path: Path
    relpath: str
    sha256: str
    io: GraphIO
    profile: EngineProfile


def plan_graphs(bundle: Any, precision: str, request: ProfileRequest) -> dict[str, _Graph]:
    """Per runtime role: the graph file, its manifest SHA-256, its I/O and its profile (no TensorRT needed).

    Raises:
        EngineBuildError: the bundle has no such variant, its INT8 graphs are not the ``tensorrt`` preset's
            (TensorRT needs symmetric signed INT8 Q/DQ), or a graph input or output has a type without a numpy
            dtype (bfloat16: the runtime could not hand it over).
    """
    if precision not in bundle.precisions:
        raise EngineBuildError(f"bundle {bundle.path} has no {precision} graphs (it holds {list(bundle.precisions)})")
    variant = bundle.variant(precision)
    if precision == "int8" and _int8_provider(variant) != "tensorrt":
        raise EngineBuildError(
            f"bundle {bundle.path}: its INT8 graphs were quantised for {variant.get('preset')!r} (provider "
            f"{_int8_provider(variant)!r}), whose Q/DQ TensorRT cannot build (it needs symmetric signed INT8); "
            "re-export with --int8 --target tensorrt or a preset whose provider is 'tensorrt'"
        )
    dims = bundle.interface.get("dims")
    if not isinstance(dims, dict):
        raise EngineBuildError(f"bundle {bundle.path}: the manifest records no interface.dims; re-export it")
    out = {}
    for role in bundle.interface["runtime_graphs"]:
        relpath = variant["files"][role]
        path = bundle.graph_path(precision, role)
        io = read_graph_io(path)
        check_dtypes((*io.inputs, *io.outputs), f"bundle {bundle.path}: {relpath}")
        out[role] = _Graph(
            role, path, relpath, bundle.manifest["files"][relpath]["sha256"], io, graph_profile(role, io, dims, request)
        )
    return out


def _int8_provider(variant: Mapping[str, Any]) -> str:
    """The provider the INT8 variant's preset was made for, as recorded at export (``deployment.provider``, so a
    user-registered TensorRT preset qualifies); bundles exported before that record: ``"tensorrt"`` for the built-in
    ``tensorrt`` preset by name, else ``"cpu"``."""
    recorded = variant.get("deployment")
    if isinstance(recorded, Mapping):
        return str(recorded.get("provider", "cpu"))
    return "tensorrt" if variant.get("preset") == "tensorrt" else "cpu"


def gather_profile(step: _Graph, states: Sequence[str]) -> EngineProfile:
    """The profile of a gather engine over ``states``: rows as the step's, a cache one longer (it gathers what the
    step wrote), the index as many rows as the output."""
    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {}
    dims = dict(step.profile.dims)
    if "past" in dims:
        low, typical, high = dims["past"]
        dims["past"] = (low, typical + 1, high + 1)
    from edgecap.runtime.engines.profiles import eval_dim

    points = [{n: r[i] for n, r in dims.items()} for i in range(3)]
    for name in states:
        spec = step.io.input(name)
        lo, opt, hi = (tuple(eval_dim(d, p) for d in spec.shape) for p in points)
        shapes[name] = (lo, opt, hi)
    rows = dims["batch"]
    shapes["index"] = ((rows[0],), (rows[1],), (rows[2],))
    return EngineProfile("gather", shapes, dims)


def build_engines(
    bundle_path: str | Path,
    *,
    precision: str = "fp16",
    max_batch: int = 16,
    beam: int | None = None,
    max_regions: int | None = None,
    workspace_mb: int = 2048,
    typing: str = "auto",
    rebuild: bool = False,
    device: int = 0,
    progress: Callable[[str], None] | None = None,
    sparse_weights: bool | None = None,
) -> EngineSet:
    """Build (or keep, when up to date) the TensorRT engines of one precision of a bundle.

    Args:
        bundle_path: the bundle directory (verified before anything is built).
        precision: ``"fp16"``, ``"int8"`` (the ``tensorrt`` preset's Q/DQ graphs) or ``"fp32"``.
        max_batch: images per call the engines serve.
        beam: beam width the step engine serves (default the bundle's); rows = ``max_batch × beam``.
        max_regions: cap on a features-in bundle's region count.
        workspace_mb: TensorRT's workspace memory-pool limit.
        typing: ``"auto"``, ``"strong"`` or ``"weak"`` (:func:`~edgecap.runtime.engines.settings.build_settings`).
        rebuild: build even when an up-to-date set exists.
        device: CUDA device index.
        progress: called with one line per stage.
        sparse_weights: set ``BuilderFlag.SPARSE_WEIGHTS`` (2:4 sparse tensor cores); None: on exactly when the
            manifest records 2:4 sparsity (:func:`~edgecap.runtime.engines.settings.records_2to4`). A kept set
            built with the other choice is rebuilt.

    Raises:
        EngineUnavailableError: no TensorRT, cuda-python or GPU here.
        EngineBuildError, ProfileError, EngineSettingsError: the bundle or request cannot give engines.
    """
    from edgecap.runtime.bundle.reader import load_bundle

    say = progress or (lambda line: log.info("%s", line))
    if not isinstance(workspace_mb, int) or workspace_mb < 1:
        raise EngineBuildError(f"workspace must be a positive number of MB, got {workspace_mb!r}")
    bundle = load_bundle(bundle_path, verify=True, graphs="none")
    request = ProfileRequest(max_batch=max_batch, beam=bundle.beam if beam is None else beam, max_regions=max_regions)
    graphs = plan_graphs(bundle, precision, request)
    trt = load_tensorrt()
    settings = build_settings(trt, precision, typing)
    if records_2to4(bundle.manifest) if sparse_weights is None else sparse_weights:
        settings = with_sparse_weights(trt, settings)
    env = current_env(trt, device)
    from edgecap.runtime.engines import cuda

    cuda.set_device(device)  # TensorRT builds (and times kernels) on the calling thread's current device
    shas = {role: g.sha256 for role, g in graphs.items()}
    key = engine_key(env, precision, {r: g.profile.digest() for r, g in graphs.items()}, shas, max_batch, request.beam)
    folder = Path(bundle.path) / ENGINES_DIR / key
    if folder.is_dir() and not rebuild:
        try:
            record = read_record(folder)
            verify_plans(folder, record)
            sparse_before = SPARSE_WEIGHTS in record.get("settings", {}).get("builder_flags", [])
            if sparse_before != (SPARSE_WEIGHTS in settings.builder_flags):
                say(f"rebuilding {folder.name}: sparse weights {'on' if not sparse_before else 'off'} now")
            elif not check_record(record, env, shas, precision):
                say(f"up to date: {folder}")
                return EngineSet(folder, record, False)
        except EngineRecordError as exc:
            say(f"rebuilding {folder.name}: {exc}")
    try:  # the cache is read only from inside the bundle (a symlink may not lead elsewhere)
        cache = engine_file(folder, TIMING_CACHE, TIMING_CACHE)
        timing = cache.read_bytes() if cache.is_file() else b""
    except EngineRecordError as exc:
        say(f"ignoring the timing cache: {exc}")
        timing = b""
    say(f"{env.describe()}; {settings.reason}")
    engines: dict[str, Any] = {}
    gathers: dict[str, Any] = {}
    with atomic_directory(folder, overwrite=True) as tmp:
        for role, graph in graphs.items():
            say(f"building {role} from {graph.relpath} (profile {_describe(graph.profile)})")
            plan, timing = tensorrt_api.build_onnx(
                trt, str(graph.path), graph.relpath, graph.profile.shapes, settings, workspace_mb, timing, say
            )
            engines[role] = _write_plan(tmp, f"{role}.plan", plan) | {
                "graph": graph.relpath,
                "graph_sha256": graph.sha256,
                "profile": graph.profile.to_dict(),
                "io": _io_record(graph.io),
            }
        if "step" in graphs:
            updated = list(bundle.updated_state_names)
            for name, states in zip(GATHERS, (updated, list(bundle.state_names)), strict=True):
                say(f"building {name} ({len(states)} states, add_gather on the rows)")
                profile = gather_profile(graphs["step"], states)
                specs = [graphs["step"].io.input(n) for n in states]
                plan = tensorrt_api.build_gather(trt, specs, profile.shapes, workspace_mb)
                gathers[name] = _write_plan(tmp, f"{name}.plan", plan) | {
                    "states": states,
                    "profile": profile.to_dict(),
                }
        atomic_write_bytes(tmp / TIMING_CACHE, timing)
        record = {
            "format": RECORD_FORMAT,
            "format_version": RECORD_VERSION,
            "key": key,
            "precision": precision,
            "env": {"trt_version": env.trt_version, "gpu_name": env.gpu_name,
                    "compute_capability": env.compute_capability},
            "settings": {"strongly_typed": settings.strongly_typed, "builder_flags": list(settings.builder_flags),
                         "reason": settings.reason, "workspace_mb": workspace_mb},
            "request": {"max_batch": max_batch, "beam": request.beam, "max_regions": max_regions},
            "engines": engines,
            "gathers": gathers,
            "metadata": dict(graphs[next(r for r in graphs if r != "encoder")].io.metadata),
            "edgecap": __version__,
            "built": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }  # fmt: skip
        from edgecap.runtime._io import atomic_write_json

        atomic_write_json(tmp / RECORD_NAME, record)
    say(f"wrote {folder}")
    _report_stale(bundle, env, folder, say)
    return EngineSet(folder, record, True)


def _report_stale(bundle: Any, env: EngineEnv, current: Path, say: Callable[[str], None]) -> None:
    """Name the other engine sets of the bundle that can no longer run here (another TensorRT, GPU or graph): they
    are kept, since another machine may use them, and can be deleted to reclaim space."""
    from edgecap.runtime.engines.store import engine_folders

    for folder in engine_folders(Path(bundle.path)):
        if folder == current:
            continue
        try:
            record = read_record(folder)
            precision = record["precision"]
            files = bundle.variant(precision)["files"]
            shas = {role: bundle.manifest["files"][name]["sha256"] for role, name in files.items()}
            problems = check_record(record, env, shas, precision)
        except (EngineRecordError, KeyError, ValueError) as exc:  # unreadable, or a precision the bundle lost
            problems = [str(exc)]
        if problems:
            say(f"stale here: {folder.name} ({'; '.join(problems)}); delete it if no other machine uses it")


def _describe(profile: EngineProfile) -> str:
    return ", ".join(f"{n} {lo}..{hi}" for n, (lo, _, hi) in profile.dims.items())


def _io_record(io: GraphIO) -> dict[str, Any]:
    def rows(specs: Sequence[TensorMeta]) -> list[dict[str, Any]]:
        return [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in specs]

    return {"inputs": rows(io.inputs), "outputs": rows(io.outputs)}


def _write_plan(folder: Path, name: str, plan: bytes) -> dict[str, Any]:
    import hashlib

    atomic_write_bytes(folder / name, plan)
    return {"plan": name, "plan_sha256": hashlib.sha256(plan).hexdigest(), "bytes": len(plan)}
