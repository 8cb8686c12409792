"""``edgecap engine``: build a bundle's TensorRT engines on the machine that will run them."""

from __future__ import annotations

from pathlib import Path

import click

from edgecap.bench.harness import MAX_BATCH
from edgecap.cli.options import fail
from edgecap.runtime.decoding.config import MAX_BEAM
from edgecap.runtime.precisions import PRECISIONS


@click.command("engine")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option(
    "--precision",
    type=click.Choice(PRECISIONS),
    default="fp16",
    show_default=True,
    help="Which graphs to build from: FP32, FP16, or INT8 Q/DQ (a bundle exported with --int8 --target tensorrt).",
)
@click.option(
    "--max-batch",
    type=click.IntRange(1, MAX_BATCH),
    default=16,
    show_default=True,
    help=f"Images per call (at most {MAX_BATCH}).",
)
@click.option(
    "--beam",
    type=click.IntRange(1, MAX_BEAM),
    default=None,
    help="Beam width the step engine serves (rows = max batch × beam); default the bundle's.",
)
@click.option("--max-regions", type=click.IntRange(1), default=None, help="Features-in bundles: most regions.")
@click.option("--workspace", type=click.IntRange(1), default=2048, show_default=True, help="TensorRT workspace, MB.")
@click.option(
    "--typing",
    type=click.Choice(["auto", "strong", "weak"]),
    default="auto",
    show_default=True,
    help="Network typing (auto: strongly typed, except INT8 on TensorRT 10.3-10.11, built weakly typed with flags).",
)
@click.option(
    "--sparse-weights/--no-sparse-weights",
    default=None,
    help="TensorRT's SPARSE_WEIGHTS flag (2:4 sparse tensor cores, Ampere and later) [default: on when the bundle "
    "records 2:4 sparsity: edgecap prune --sparsity 2:4].",
)
@click.option("--rebuild", is_flag=True, help="Build even when an up-to-date engine set exists.")
@click.option("--device", type=click.IntRange(0), default=0, show_default=True, help="CUDA device index.")
def engine(
    bundle: Path,
    precision: str,
    max_batch: int,
    beam: int | None,
    max_regions: int | None,
    workspace: int,
    typing: str,
    sparse_weights: bool | None,
    rebuild: bool,
    device: int,
) -> None:
    """Build TensorRT engines for BUNDLE, stored in BUNDLE/engines/ keyed by TensorRT version, GPU, precision and
    profile (the `tensorrt` runtime loads them: edgecap caption --runtime tensorrt).

    \b
    edgecap engine bundles/acort-xsmall --precision fp16 --max-batch 64 --beam 3
    edgecap engine bundles/acort-xsmall --precision int8 --rebuild
    """
    from edgecap.runtime.bundle.layout import find_bundle
    from edgecap.runtime.bundle.manifest import BundleError
    from edgecap.runtime.engines.build import EngineBuildError, EngineUnavailableError, build_engines
    from edgecap.runtime.engines.cuda import CudaError
    from edgecap.runtime.engines.graphs import GraphReaderMissingError
    from edgecap.runtime.engines.profiles import ProfileError
    from edgecap.runtime.engines.settings import EngineSettingsError

    # Each piece this machine may lack is one line, never a traceback: onnx (GraphReaderMissingError), TensorRT,
    # cuda-python or a usable driver (EngineUnavailableError), a CUDA call on the chosen device (CudaError).
    refusals = (
        BundleError,
        EngineBuildError,
        EngineUnavailableError,
        ProfileError,
        EngineSettingsError,
        GraphReaderMissingError,
        CudaError,
    )

    try:
        result = build_engines(
            find_bundle(bundle) or bundle,
            precision=precision,
            max_batch=max_batch,
            beam=beam,
            max_regions=max_regions,
            workspace_mb=workspace,
            typing=typing,
            rebuild=rebuild,
            device=device,
            sparse_weights=sparse_weights,
            progress=lambda line: click.echo(line, err=True),
        )
    except refusals as exc:
        fail(str(exc))
        return
    state = "built" if result.built else "kept (up to date)"
    click.echo(f"{state}: {result.folder}")
