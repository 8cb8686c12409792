"""``edgecap caption``: describe images with a bundle or a trained run."""

from __future__ import annotations

from pathlib import Path

import click

from edgecap.cli.caption_collection import COLLECTION_OPTIONS, caption_collection_command, is_collection
from edgecap.cli.options import (
    apply_threads,
    beam_option,
    device_option,
    fail,
    onnxruntime_threads_options,
    print_captions,
    runtime_precision_options,
    torch_thread_count,
)
from edgecap.runtime.backends.registry import get_runtime


@click.command("caption")
@click.argument("images", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--model",
    "model",
    default="acort-xsmall",
    show_default=True,
    help="A bundle directory (`edgecap export`), a run directory, or a model name: its bundle in "
    "$EDGECAP_HOME/bundles/NAME when there is one, else its run in $EDGECAP_HOME/runs/NAME (needs torch).",
)
@beam_option
@runtime_precision_options("Bundles: ", runs_use_torch=True)
@click.option(
    "--backbone-weights",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Local backbone weights, when the run's features were made with a weights file.",
)
@click.option(
    "--length-level",
    type=click.IntRange(1),
    default=None,
    help="Caption length level (1 = shortest; LaBERT and *-len models): 4-level plan 1-9, 10-14, 15-19, 20-25 words.",
)
@click.option("--json", "as_json", is_flag=True, help="Print {image: caption} as JSON.")
@click.option(
    "--skip-bad-images",
    is_flag=True,
    help="Caption the images that load; report each one that does not (missing, truncated, not an image) on stderr "
    "(null in --json) and exit with status 1.",
)
@onnxruntime_threads_options()
@click.option(
    "--trt-opt-batch",
    type=click.IntRange(1),
    default=None,
    help="ONNX Runtime's TensorRT provider: images per call its engines are tuned for (default 8; any batch the "
    "bundle allows still runs).",
)
@click.option(
    "--trt-workspace-mb",
    type=click.IntRange(0),
    default=None,
    help="ONNX Runtime's TensorRT provider: workspace limit in MiB (default 1024, sized for a Jetson; 0 = no limit).",
)
@device_option
@COLLECTION_OPTIONS
@click.option(
    "--server",
    default=None,
    metavar="URL",
    help="Caption through a running `edgecap serve` (http://HOST:8000 or grpc://HOST:8001; the [client] extra); "
    "--model then names the served model (default: the server's only one).",
)
def caption(
    images: tuple[Path, ...],
    model: str,
    beam: int,
    runtime: str,
    precision: str,
    backbone_weights: Path | None,
    length_level: int | None,
    as_json: bool,
    skip_bad_images: bool,
    threads: int | str,
    spin: bool | None,
    trt_opt_batch: int | None,
    trt_workspace_mb: int | None,
    device: str,
    out: Path | None,
    recursive: bool,
    resume: bool,
    workers: int | None,
    ray: str | None,
    server: str | None,
) -> None:
    """Caption IMAGES with a bundle or a trained model.

    A directory among IMAGES, or --out, captions a collection into a JSONL file (docs/collections.md):

    \b
    edgecap caption photos/ --recursive --out captions.jsonl --workers 2
    edgecap caption photos/ --recursive --out captions.jsonl --resume
    """
    import importlib.util
    import warnings

    from click.core import ParameterSource

    from edgecap.runtime.backends.onnxruntime.fallback import ProviderFallback, ProviderFallbackWarning
    from edgecap.runtime.bundle.layout import find_bundle
    from edgecap.runtime.captioner import Captioner, SkippedImageWarning

    # an unset --beam is the model's own decoding (a mask-predict model refuses a beam it would ignore)
    asked_beam = None if click.get_current_context().get_parameter_source("beam") == ParameterSource.DEFAULT else beam

    if server is not None:
        local = {"--runtime": runtime != "auto", "--precision": precision != "auto", "--out": out is not None}
        local |= {"--backbone-weights": backbone_weights is not None, "--ray": ray is not None}
        for flag, given in local.items():
            if given:
                fail(f"{flag} does not apply with --server: the server chose its runtime and model")
        from edgecap.cli.caption_server import caption_with_server

        model_given = click.get_current_context().get_parameter_source("model") != ParameterSource.DEFAULT
        caption_with_server(
            images,
            server,
            model=model if model_given else None,
            length_level=length_level,
            beam=asked_beam,
            as_json=as_json,
        )
        return
    if is_collection(images, out, ray):
        load = {"runtime": runtime, "precision": precision, "beam": asked_beam, "threads": threads, "spin": spin}
        load |= {"device": None if device == "auto" else device}
        load |= {"trt_opt_batch": trt_opt_batch, "trt_workspace_mb": trt_workspace_mb}
        refused = {"--json": as_json, "--backbone-weights": backbone_weights is not None}
        caption_collection_command(
            images,
            out=out,
            recursive=recursive,
            resume=resume,
            workers=workers,
            ray=ray,
            model=model,
            load=load,
            length_level=length_level,
            refused=refused,
        )
        return
    for flag, given in {"--recursive": recursive, "--resume": resume, "--workers": workers is not None}.items():
        if given:
            fail(f"{flag} is for collections: name a directory, or pass --out FILE.jsonl (docs/collections.md)")

    if not skip_bad_images:  # before a model is loaded, not after
        missing = [str(p) for p in images if not p.is_file()]
        if missing:
            shown = ", ".join(missing[:5]) + (" …" if len(missing) > 5 else "")
            fail(f"no such image file ({len(missing)} of {len(images)}): {shown}; --skip-bad-images captions the rest")

    try:
        bundle = find_bundle(model)
        if bundle is not None:
            with warnings.catch_warnings():  # said once below, from runtime_info
                warnings.simplefilter("ignore", ProviderFallbackWarning)
                captioner = Captioner.load(
                    bundle,
                    runtime=runtime,
                    precision=precision,
                    beam=asked_beam,
                    threads=threads,
                    spin=spin,
                    device=None if device == "auto" else device,
                    trt_opt_batch=trt_opt_batch,
                    trt_workspace_mb=trt_workspace_mb,
                )
            fallback = captioner.runtime_info.get("provider_fallback")
            if fallback:  # one line, in both output modes (stderr: --json's stdout stays JSON)
                said = ProviderFallback(tuple(fallback["requested"]), tuple(fallback["in_use"]), fallback["cause"])
                click.echo(f"warning: ONNX Runtime is {said.describe()}", err=True)
            if get_runtime(captioner.runtime_info["runtime"]).torch or captioner.backbone is not None:
                apply_threads(torch_thread_count(threads))  # torch already runs here, and the CLI owns its process
            if not as_json:
                click.echo(f"runtime: {captioner.runtime_info['summary']}", err=True)
        else:
            if importlib.util.find_spec("torch") is None:
                fail(
                    f"no bundle found for {model!r} (a bundle directory, or $EDGECAP_HOME/bundles/{model}); "
                    "captioning with a training run needs torch: pip install 'edgecap[train]'"
                )
            if (runtime != "auto" and not get_runtime(runtime).torch) or precision not in ("auto", "fp32"):
                fail(
                    f"{model} is a trained run, which runs on torch at FP32; --runtime {runtime} and --precision "
                    f"fp16/int8 need a bundle: `edgecap export --model {model}` (written to "
                    "$EDGECAP_HOME/bundles/NAME; --out BUNDLE to choose)"
                )
            from edgecap.workshop.torch_runtime.runtime import resolve_device

            apply_threads(torch_thread_count(threads))  # the CLI owns its process: torch's thread count is process-wide
            captioner = Captioner.from_run(
                model, device=str(resolve_device(device)), beam=asked_beam, backbone_weights=backbone_weights
            )
        with captioner, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", SkippedImageWarning)
            errors = "skip" if skip_bad_images else "raise"
            captions = captioner.batch([str(p) for p in images], length_level=length_level, errors=errors)
    except (ValueError, FileNotFoundError, RuntimeError, ImportError) as exc:
        fail(str(exc))
    for warning in caught:
        if isinstance(warning.message, SkippedImageWarning):
            click.echo(f"Error: {warning.message.error}", err=True)
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    print_captions({str(p): c for p, c in zip(images, captions, strict=True)}, as_json)
