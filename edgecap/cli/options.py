"""Reusable click options and small parsing helpers shared by commands."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from edgecap.decoding.config import MAX_BEAM


def parse_overrides(items: tuple[str, ...]) -> dict[str, Any]:
    """``key=value`` pairs; values are parsed as JSON when possible (numbers, lists, booleans), else strings."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--set")
        key, raw = item.split("=", 1)
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key.strip().replace("-", "_")] = value
    return out


def device_option(fn: Callable) -> Callable:
    return click.option(
        "--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto (CUDA when available)."
    )(fn)


def beam_option(fn: Callable) -> Callable:
    return click.option(
        "--beam",
        "beam",
        type=click.IntRange(1, MAX_BEAM),
        default=3,
        show_default=True,
        help=f"Beam size (1 = greedy; at most {MAX_BEAM}).",
    )(fn)


class RuntimeName(click.ParamType):
    """``auto`` or a registered runtime, checked against the registry when the command runs (so a runtime registered
    after import counts, and an older name is read as the current one, with a warning)."""

    name = "runtime"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from edgecap.runtimes.registry import canonical_runtime, list_runtimes

        if value == "auto":
            return value
        name = canonical_runtime(str(value), warn=True)
        if name not in list_runtimes():
            self.fail(f"{value!r} is not a registered runtime; choose auto or one of {list_runtimes()}", param, ctx)
        return name


def fail(message: str) -> None:
    """Stop a command with a clear one-line error instead of a traceback."""
    raise click.ClickException(message)


def threads_option(fn: Callable) -> Callable:
    return click.option(
        "--threads",
        type=click.IntRange(0),
        default=0,
        help="torch intra-op threads (0 = torch's default). On a busy 2-core machine 1 can be several times faster.",
    )(fn)


def apply_threads(threads: int) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)
