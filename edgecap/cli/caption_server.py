"""``edgecap caption IMAGES --server URL``: caption through a running ``edgecap serve`` (docs/serving.md)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from edgecap.cli.options import fail, print_captions


def caption_with_server(
    images: Sequence[Path],
    url: str,
    *,
    model: str | None,
    length_level: int | None,
    beam: int | None,
    as_json: bool,
    concurrency: int = 8,
    timeout_s: float = 60.0,
) -> None:
    """Send each image as its own request (the server batches them) and print the captions in order; an image the
    server refuses, or that cannot be read here, is reported on stderr and the command exits with status 1. With
    ``$EDGECAP_SERVE_TOKEN`` set, every request carries it (a server started with a token requires it)."""
    import os

    from edgecap.runtime.serving.lockdown import TOKEN_ENV

    token = os.environ.get(TOKEN_ENV)
    try:
        from edgecap.runtime.serving.client import CaptionClient, ModelNotServedError, ServerBusyError

        client = CaptionClient(url, model, timeout_s=timeout_s, token=token)
    except (ImportError, ValueError) as exc:
        fail(str(exc))
    payloads: list[object] = []
    for path in images:
        try:
            payloads.append(path.read_bytes())
        except OSError as exc:
            payloads.append(OSError(exc.strerror or str(exc)))
    sendable = [p for p in payloads if not isinstance(p, Exception)]
    with client:
        try:
            replies = iter(client.caption_many(sendable, concurrency=concurrency, length_level=length_level, beam=beam))
        except (ServerBusyError, ModelNotServedError, ValueError) as exc:
            fail(str(exc))
        results = [p if isinstance(p, Exception) else next(replies) for p in payloads]
    captions: dict[str, str | None] = {}
    for path, result in zip(images, results, strict=True):
        if isinstance(result, (ServerBusyError, ModelNotServedError)):
            fail(str(result))  # the server, not the image: nothing more will get through
        if isinstance(result, Exception):
            click.echo(f"Error: {path}: {result}", err=True)
            captions[str(path)] = None
        else:
            captions[str(path)] = result.caption
    print_captions(captions, as_json)
