"""Measurement programs and research helpers that are not part of the edgecap wheel.

Each program runs from the repository root as ``python -m tools.NAME --help`` (``edgecap`` importable: installed, or
the checkout on ``PYTHONPATH``). ``edgecap bench`` is the shipped benchmark; these measure serving, collections,
streams, the GPU check, the edge footprint and soak, and hold the helpers of the studies in ``research/``.
"""

from __future__ import annotations

from collections.abc import Sequence

import click

__all__ = ["run_program"]


def run_program(command: click.Command, argv: Sequence[str] | None = None) -> int:
    """Run a program's click ``command`` on ``argv`` (default: the command line) and give its exit status: what the
    command returned, or 2 after printing a usage error as a shell would see it. Tests call programs this way."""
    try:
        status = command.main(args=None if argv is None else list(argv), standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    return status if isinstance(status, int) else 0
