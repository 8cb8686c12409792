"""Reusable click options and small parsing helpers shared by commands."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import click

from edgecap.runtime.decoding.config import MAX_BEAM


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


def option_group(*options: Callable[[Callable], Callable]) -> Callable[[Callable], Callable]:
    """Several click options as one decorator, applied in the order listed (so ``--help`` lists them so): commands
    share and group their flags instead of stacking dozens of decorators and parameters."""

    def apply(fn: Callable) -> Callable:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return apply


class FiniteFloat(click.FloatRange):
    """A float option's type: a finite number (``nan``, ``inf`` and ``-inf`` are refused as usage errors, where
    click's own float would let them through its range checks and on into a traceback or a silent NaN run), in an
    optional range as :class:`click.FloatRange` takes it. Every float option of every command uses it."""

    def __init__(
        self, min: float | None = None, max: float | None = None, *, min_open: bool = False, max_open: bool = False
    ) -> None:
        super().__init__(min=min, max=max, min_open=min_open, max_open=max_open)
        if min is None and max is None:
            self.name = "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number

    def _describe_range(self) -> str:
        return "" if self.min is None and self.max is None else super()._describe_range()


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
        from edgecap.runtime.backends.registry import canonical_runtime, list_runtimes

        if value == "auto":
            return value
        name = canonical_runtime(str(value), warn=True)
        if name not in list_runtimes():
            self.fail(f"{value!r} is not a registered runtime; choose auto or one of {list_runtimes()}", param, ctx)
        return name


def fail(message: str) -> NoReturn:
    """Stop a command with a clear one-line error instead of a traceback."""
    raise click.ClickException(message)


def check_out(path: Path, flag: str = "--out", *, existing: str = "into", atomic: bool = False) -> Path:
    """Check an output location before the command does any work (:func:`edgecap.runtime._io.check_output_location`):
    a read-only place, a file in the way or a name too long stops the command with one line, not a traceback after
    the work. ``existing`` is what an existing directory is to the command (``refuse``, ``replace``, ``into``);
    ``atomic``: the directory is built in a temporary sibling and moved into place (its name needs room for that)."""
    from edgecap.runtime._io import SIBLING_RESERVE, check_output_location

    try:
        check_output_location(path, existing=existing, what=flag, reserve=SIBLING_RESERVE if atomic else 0)  # type: ignore[arg-type]
    except (ValueError, OSError) as exc:
        fail(str(exc))
    return path


def check_apart(out: Path, other: Path, what: str, flag: str = "--out") -> None:
    """Refuse an output directory that is ``other`` (a run the command reads: ``what`` names it, e.g. ``--teacher
    RUN``), lies inside it or holds it: writing there would rewrite or copy into the input itself."""
    mine, theirs = out.resolve(), other.resolve()
    if mine == theirs:
        fail(f"{flag} {out} is {what} itself: write the new run elsewhere")
    if theirs in mine.parents or mine in theirs.parents:
        where = "inside" if theirs in mine.parents else "around"
        fail(f"{flag} {out} lies {where} {what} ({other}): write the new run elsewhere")


def bounded_threads(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    """A click callback: a thread count above :func:`edgecap.runtime.backends.threads.max_threads` is a usage error."""
    from edgecap.runtime.backends.threads import ThreadSettingError, check_threads

    try:
        check_threads(value)
    except ThreadSettingError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None
    return value


def threads_option(fn: Callable) -> Callable:
    return click.option(
        "--threads",
        type=click.IntRange(0),
        default=0,
        callback=bounded_threads,
        help="torch intra-op threads (0 = torch's default). On a busy 2-core machine 1 can be several times faster.",
    )(fn)


def apply_threads(threads: int) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


class ThreadsValue(click.ParamType):
    """``auto``, ``dedicated`` or a thread count >= 0 (:func:`edgecap.runtime.backends.threads.plan_threads`)."""

    name = "auto|dedicated|N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        from edgecap.runtime.backends.threads import THREAD_POLICIES, ThreadSettingError, check_threads

        text = str(value).strip().lower()
        if text in THREAD_POLICIES:
            return text
        if (isinstance(value, int) and not isinstance(value, bool) and value >= 0) or text.isdigit():
            try:
                check_threads(int(value))
            except ThreadSettingError as exc:
                self.fail(str(exc), param, ctx)
            return int(value)
        self.fail(f"{value!r} is not {', '.join(THREAD_POLICIES)} or a thread count >= 0", param, ctx)


def onnxruntime_threads_options(default: str | None = "auto") -> Callable[[Callable], Callable]:
    """``--threads`` and ``--spin/--no-spin``: ONNX Runtime's threading on CPU (``docs/cpu.md``).

    ``default`` is what ``--threads`` gives a command when it is not passed; None lets the command tell "not given"
    from ``auto`` (``edgecap bench`` records only what was asked) and then means ``auto``.
    """
    return option_group(
        click.option(
            "--threads",
            type=ThreadsValue(),
            default=default,
            help="ONNX Runtime threads on CPU: auto (the default: one thread that never spins, right on a shared or "
            "small CPU), "
            "dedicated (cores this process owns: large models use them, spinning), or an intra-op count "
            "(0 = ONNX Runtime's own default). A count >= 1 also sets torch's threads where torch runs.",
        ),
        click.option(
            "--spin/--no-spin",
            default=None,
            help="Let ONNX Runtime's idle pool threads spin (faster hand-off, burns the core) [default: the policy's].",
        ),
    )


def torch_thread_count(threads: int | str) -> int:
    """The torch thread count an ``--threads`` value implies: the count itself, 0 (leave torch alone) for a policy."""
    return threads if isinstance(threads, int) else 0


def runtime_precision_options(what: str = "", *, runs_use_torch: bool = False) -> Callable[[Callable], Callable]:
    """``--runtime`` and ``--precision``, as ``Captioner.load`` takes them; ``what`` prefixes their help, and
    ``runs_use_torch`` adds that a training run (which ``caption`` also takes) always decodes on torch."""
    from edgecap.runtime.backends.registry import list_runtimes
    from edgecap.runtime.precisions import PRECISIONS

    runs = " Runs use torch." if runs_use_torch else ""
    return option_group(
        click.option(
            "--runtime",
            type=RuntimeName(),
            default="auto",
            show_default=True,
            help=f"{what}auto (the first installed: ONNX Runtime, then torch) or a registered runtime "
            f"({', '.join(list_runtimes())}).{runs}",
        ),
        click.option(
            "--precision",
            type=click.Choice(["auto", *PRECISIONS]),
            default="auto",
            show_default=True,
            help=f"{what}{'which' if what else 'Which'} exported variant (auto = the best for the runtime).",
        ),
    )


def print_captions(captions: Mapping[str, str | None], as_json: bool) -> None:
    """Print ``image -> caption`` (JSON, or ``image: caption`` lines); an image that got no caption (None) makes the
    command exit 1 after saying how many, so a script sees a partial batch as a failure."""
    if as_json:
        click.echo(json.dumps(dict(captions), indent=2))
    else:
        for image, text in captions.items():
            if text is not None:
                click.echo(f"{image}: {text}")
    failed = sum(text is None for text in captions.values())
    if failed:
        click.echo(f"{failed} of {len(captions)} image(s) could not be captioned", err=True)
        raise SystemExit(1)
