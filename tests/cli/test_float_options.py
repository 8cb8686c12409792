"""Every float option of every command refuses ``nan``, ``inf`` and ``-inf`` as a usage error: click's own float type
lets them through its range checks (``nan`` fails every comparison), on into a traceback or a silent NaN run."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from edgecap.cli import COMMANDS, main
from edgecap.cli.options import FiniteFloat

NOT_FINITE = ("nan", "NaN", "inf", "-inf", "+Infinity", "1e999")


def _commands() -> list[tuple[str, click.Command]]:
    ctx = click.Context(main)
    found: list[tuple[str, click.Command]] = []
    for name in COMMANDS:
        command = main.get_command(ctx, name)
        assert command is not None, name
        found.append((name, command))  # a group's own options too (`train` trains a new model with its own)
        if isinstance(command, click.Group):
            found += [(f"{name} {sub}", c) for sub, c in command.commands.items()]
    return found


def float_options() -> list[tuple[str, click.Parameter]]:
    """(command, parameter) for every parameter whose values are floats, whatever type object declares it (an
    option given ``type=float`` or a float default gets click's FLOAT)."""
    return [
        (name, param)
        for name, command in _commands()
        for param in command.params
        if isinstance(param.type, click.types.FloatParamType)
    ]


def test_the_walk_finds_the_float_options_of_every_compression_and_stream_command() -> None:
    names = {(name, param.opts[0]) for name, param in float_options()}
    assert {("prune", "--lr"), ("train", "--lr"), ("train", "--kd-temperature"), ("stream", "--every")} <= names
    assert {("train qat", "--lr"), ("train scst", "--max-minutes")} <= names
    assert len(names) >= 20


@pytest.mark.parametrize(("command", "param"), float_options(), ids=lambda v: getattr(v, "name", v))
def test_no_float_option_accepts_a_number_that_is_not_finite(command: str, param: click.Parameter) -> None:
    assert isinstance(param.type, FiniteFloat), f"{command} {param.opts[0]} is not a FiniteFloat"
    ctx = click.Context(click.Command(command))
    for text in NOT_FINITE:
        with pytest.raises(click.BadParameter, match="not a finite number|not in the range"):
            param.type.convert(text, param, ctx)
    if param.default is not None:  # the default, as the help shows it, still converts
        assert param.type.convert(str(param.default), param, ctx) == pytest.approx(float(param.default))


@pytest.mark.parametrize(
    "args",
    [
        ["prune", "RUN", "--out", "OUT", "--target-params", "100000", "--lr", "nan"],
        ["train", "--model", "acort-test", "--out", "OUT", "--kd-temperature", "nan"],
        ["train", "--model", "acort-test", "--out", "OUT", "--lr", "inf"],
        ["train", "qat", "--lr", "nan", "RUN", "--out", "OUT", "--epochs", "1"],
        ["stream", "clip.mkv", "--every", "nan"],
        ["stream", "clip.mkv", "--on-change", "nan"],
    ],
)
def test_a_command_line_with_nan_is_a_usage_error_before_any_work(tmp_path: Path, args: list[str]) -> None:
    args = [str(tmp_path / a) if a in ("RUN", "OUT") else a for a in args]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "is not a finite number" in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert not (tmp_path / "OUT").exists()


def test_an_unbounded_finite_float_reads_as_a_plain_float_in_help() -> None:
    assert FiniteFloat().name == "float" and FiniteFloat()._describe_range() == ""
    assert FiniteFloat(0, min_open=True)._describe_range() == "x>0"
    with pytest.raises(click.BadParameter, match="not in the range"):
        FiniteFloat(0, min_open=True).convert("-1", None, None)
    assert FiniteFloat(0, 2).convert("1.5", None, None) == 1.5
