"""``edgecap serve`` and ``edgecap triton-repo``: bundles behind NVIDIA Triton Inference Server (docs/serving.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from edgecap.cli.options import ThreadsValue, fail, option_group, runtime_precision_options


def batching_options(fn: Callable) -> Callable:
    """Triton's dynamic batching and instances, and the runtime each instance loads (``ServingOptions``)."""
    fn = runtime_precision_options("Each instance loads: ")(fn)
    return option_group(
        click.option("--max-batch", type=click.IntRange(1, 1 << 16), default=64, show_default=True,
                     help="Most images Triton's dynamic batcher puts in one batch."),
        click.option("--max-queue-delay-us", type=click.IntRange(0, 60_000_000), default=0, show_default=True,
                     help="How long a request may wait for batch-mates (microseconds)."),
        click.option("--max-queue-size", type=click.IntRange(0, 1 << 24), default=256, show_default=True,
                     help="Requests queued beyond this are refused at once with Triton's error (0 = no limit)."),
        click.option("--instances", type=click.IntRange(1, 256), default=1, show_default=True,
                     help="Model instances (processes) per bundle, each with its own captioner and threads."),
        click.option("--threads", type=ThreadsValue(), default="auto", show_default=True,
                     help="ONNX Runtime threads per instance: auto, dedicated or a count (docs/cpu.md)."),
        click.option("--max-pixels", type=click.IntRange(1), default=50_000_000, show_default=True,
                     help="Most pixels of one image; a larger one is refused (400) from its header, never decoded."),
        click.option("--max-batch-mb", type=click.IntRange(1, 1 << 20), default=256, show_default=True,
                     help="Most input MiB one instance takes into a batch; a request beyond it gets 503 (retry)."),
    )(fn)  # fmt: skip


def serving_options_from(params: dict[str, Any]) -> Any:
    from edgecap.runtime.serving.repository import ServingOptions

    return ServingOptions(
        max_batch=params["max_batch"],
        max_queue_delay_us=params["max_queue_delay_us"],
        max_queue_size=params["max_queue_size"],
        instances=params["instances"],
        runtime=params["runtime"],
        precision=params["precision"],
        threads=params["threads"],
        max_pixels=params["max_pixels"],
        max_batch_bytes=params["max_batch_mb"] << 20,
    )


def resolve_bundles(names: tuple[str, ...]) -> list[Path]:
    """Bundle directories or names of exported models ($EDGECAP_HOME/bundles/NAME), each checked to exist."""
    from edgecap.runtime.bundle.layout import find_bundle

    found = []
    for name in names:
        bundle = find_bundle(name)
        if bundle is None:
            fail(
                f"no bundle found for {name!r} (a bundle directory, or $EDGECAP_HOME/bundles/{name}): `edgecap export`"
            )
        found.append(Path(bundle))
    return found


@click.command("serve")
@click.argument("bundles", nargs=-1)
@click.option(
    "--model-repository",
    "repository",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Serve this model repository (`edgecap triton-repo`) instead of BUNDLES.",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface). Anything but loopback "
    "wants $EDGECAP_SERVE_TOKEN and TLS in front (docs/serving.md, Security).",
)
@click.option("--http-port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--grpc-port", type=click.IntRange(1, 65535), default=8001, show_default=True)
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=8002, show_default=True)
@click.option(
    "--exit-timeout",
    type=click.IntRange(0, 3600),
    default=30,
    show_default=True,
    help="On SIGTERM: seconds to finish requests in flight (new ones are refused meanwhile).",
)
@click.option(
    "--max-request-mb",
    type=click.IntRange(1, 1 << 20),
    default=160,
    show_default=True,
    help="Most MiB of one HTTP request body; a larger one is refused (400) before it is read.",
)
@click.option(
    "--max-inflight-mb",
    type=click.IntRange(1, 1 << 20),
    default=256,
    show_default=True,
    help="Most MiB of HTTP request bodies held at once; a request beyond it gets 503 (retry).",
)
@batching_options
def serve(
    bundles: tuple[str, ...],
    repository: Path | None,
    host: str,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    exit_timeout: int,
    max_request_mb: int,
    max_inflight_mb: int,
    **batching: Any,
) -> None:
    """Serve BUNDLES with Triton Inference Server (HTTP + gRPC, KServe v2): one model per bundle, named after it.

    Needs the [serve] extra. Runs in the foreground until SIGTERM or Ctrl-C, which drain: requests in flight
    finish, new ones are refused. With $EDGECAP_SERVE_TOKEN set, every request but health needs the header
    `edgecap-token: TOKEN`; loading, unloading and shared memory are never open to clients."""  # fmt: skip
    import os
    import shutil

    from edgecap.runtime.serving.guard import HttpGuard, HttpLimits
    from edgecap.runtime.serving.lockdown import (
        GRPC_TOKEN_HEADER,
        TOKEN_ENV,
        TOKEN_HEADER,
        GuardError,
        check_endpoints,
        check_token,
        is_loopback,
        work_folder,
    )
    from edgecap.runtime.serving.repository import write_triton_repository
    from edgecap.runtime.serving.server import (
        Endpoints,
        ServerError,
        TritonDistribution,
        TritonServer,
        serve_until_signalled,
    )

    if bool(bundles) == (repository is not None):
        fail("give BUNDLES or --model-repository DIR (one of them)")
    ports = {"--http-port": http_port, "--grpc-port": grpc_port, "--metrics-port": metrics_port}
    try:
        TritonDistribution.find()  # before any work: is the server installed at all
        token = check_token(os.environ.get(TOKEN_ENV))
        options = serving_options_from(batching)
        limits = HttpLimits(options.max_pixels, max_request_mb << 20, max_inflight_mb << 20)
        found = resolve_bundles(bundles)
        if repository is not None:
            models = repository_models(repository)
        check_endpoints(host, ports)  # last, closest to the start
    except (GuardError, ServerError, ValueError) as exc:
        fail(str(exc))
    if not is_loopback(host) and token is None:
        click.echo(
            f"Warning: listening on {host} without authentication: anyone who reaches these ports can use the "
            f"models; set ${TOKEN_ENV} and put TLS in front (docs/serving.md, Security)",
            err=True,
        )
    # Triton's HTTP listens on a private loopback port; the public one is the bounded front (guard.py says why)
    endpoints = Endpoints(host, http_port, grpc_port, metrics_port)
    work = work_folder()
    guard = HttpGuard(host, http_port, _free_loopback_port(), limits)
    try:
        try:
            guard.start()
        except OSError as exc:
            fail(f"cannot listen on {host}:{http_port}: {exc.strerror or exc}")
        triton_endpoints = Endpoints(host, guard.upstream_port, grpc_port, metrics_port, http_host="127.0.0.1")
        if repository is None:
            try:
                models = list(write_triton_repository(found, work / "models", options, link=True))
            except (ValueError, OSError) as exc:
                fail(str(exc))
            repository = work / "models"
        server = TritonServer(repository.resolve(), work, triton_endpoints, exit_timeout_s=exit_timeout, token=token)
        server.start(log_to_file=False)
        try:
            server.wait_ready(timeout_s=300)
        except ServerError as exc:
            server.stop(timeout_s=0)
            fail(str(exc))
        for name in models:
            click.echo(f"serving {name}: {endpoints.http_url} (HTTP), {endpoints.grpc_url} (gRPC); "
                       f"metrics {endpoints.metrics_url}", err=True)  # fmt: skip
        if token is not None:
            click.echo(
                f"every request but health needs the header {TOKEN_HEADER!r} (${TOKEN_ENV}; on gRPC "
                f"{GRPC_TOKEN_HEADER!r}: edgecap's client sends it)",
                err=True,
            )
        code = serve_until_signalled(server, report=lambda message: click.echo(f"Error: {message}", err=True))
        click.echo(
            "drained: every accepted request was answered" if code == 0 else f"stopped (status {code})", err=True
        )
    finally:
        guard.stop()
        shutil.rmtree(work, ignore_errors=True)
    raise SystemExit(code)


def _free_loopback_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def repository_models(repository: Path) -> list[str]:
    """The models of a Triton repository (directories with a ``config.pbtxt``); refuses one without any."""
    models = sorted(p.name for p in repository.iterdir() if (p / "config.pbtxt").is_file())
    if not models:
        raise ValueError(
            f"no models in {repository}: a model repository has a directory with a config.pbtxt per model "
            "(`edgecap triton-repo BUNDLE DIR` writes one)"
        )
    return models


@click.command("triton-repo")
@click.argument("bundles", nargs=-1, required=True)
@click.argument("dest", type=click.Path(path_type=Path))
@batching_options
def triton_repo(bundles: tuple[str, ...], dest: Path, **batching: Any) -> None:
    """Write a Triton model repository DEST serving BUNDLES (config.pbtxt + Python-backend model.py + the bundle),
    for the official Triton container or `tritonserver --model-repository DEST`."""
    from edgecap.runtime.serving.repository import write_triton_repository

    try:
        options = serving_options_from(batching)
        models = write_triton_repository(resolve_bundles(bundles), dest, options)
    except (ValueError, OSError) as exc:
        fail(str(exc))
    for name, path in models.items():
        click.echo(f"{name}: {path}")
