"""The docs name only commands and flags the CLI has, and help texts that list choices read them from the code.

Every ``edgecap <command> [<subcommand>] --flag`` in README.md, CONTRIBUTING.md and docs/*.md (shell code blocks
and inline code spans) is checked against the click tree of :data:`edgecap.cli.main`, walked with click's own API,
so a renamed or removed flag fails here instead of in a user's shell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from edgecap.cli import COMMANDS, main
from edgecap.runtime.backends.registry import STEP_MODES, list_runtimes
from edgecap.runtime.precisions import PRECISIONS

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~)[ \t]*([\w-]*)[^\n]*\n(.*?)^\1[ \t]*$", re.S | re.M)
_SHELL = frozenset({"", "bash", "sh", "shell", "console", "zsh"})
_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
# `edgecap <command>`, `python -m edgecap <command>`; not `edgecap/cli`, `edgecap.cli`, `edgecap's`, `edgecap[train]`
_INVOCATION = re.compile(r"(?<![\w./\[-])edgecap[ \t]+(?=[a-z-])")
# Where one shell command ends: a pipe, a list or a comment (a table's escaped pipe `\|` is not one).
_END = re.compile(r"(?<!\\)\||&&|;|\s#")
_FLAG = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")


@dataclass(frozen=True)
class Use:
    """One ``edgecap ...`` command line written in a doc."""

    where: str
    words: tuple[str, ...]


def _code(text: str) -> list[tuple[str, str]]:
    """The shell code a markdown file shows, as (the prose just before it, the code): each line of its shell fenced
    blocks (backslash continuations joined; ``python``, ``text`` and other blocks are not shell), then each inline
    code span outside the blocks, paragraph by paragraph."""
    pieces: list[tuple[str, str]] = []
    for match in _FENCE.finditer(text):
        if match.group(2) in _SHELL:
            pieces += [("", line) for line in match.group(3).replace("\\\n", " ").splitlines()]
    for paragraph in re.split(r"\n\s*\n", _FENCE.sub("", text)):
        pieces += [(paragraph[: m.start()], m.group(2).replace("\n", " ")) for m in _SPAN.finditer(paragraph)]
    return pieces


def uses(text: str, where: str) -> list[Use]:
    """Every ``edgecap`` command line in ``text`` (markdown), as the words after ``edgecap``; ``caption/bench``
    (one line for two commands) is one use per command."""
    found = []
    for before, piece in _code(text):
        for match in _INVOCATION.finditer(piece):
            if (before + piece[: match.start()]).rstrip().endswith("install"):
                continue  # `pip install edgecap onnx` names packages, not a command
            rest = _END.split(piece[match.end() :], maxsplit=1)[0]
            words = [w.strip("[](),'\"") for w in rest.split()]
            words = [w for w in words if w]
            for command in words[0].split("/") if words else [""]:
                found.append(Use(where, tuple([command, *words[1:]] if command else words)))
    return found


def _flags(command: click.Command, ctx: click.Context) -> set[str]:
    names = {"--help"}
    for param in command.get_params(ctx):
        names.update(o for o in (*param.opts, *param.secondary_opts) if o.startswith("--"))
    return names


def problems(use: Use) -> list[str]:
    """What in ``use`` the CLI does not have: an unknown command or subcommand, or a flag no command on its path
    takes (a group's flags come before its subcommand's)."""
    ctx = click.Context(main, info_name="edgecap")
    words = list(use.words)
    if not words or words[0] in ("--help", "--version"):
        return []
    command: click.Command | None = main
    path = ["edgecap"]
    errors: list[str] = []
    while isinstance(command, click.Group) and words:
        name = words.pop(0)
        if name.startswith("-"):
            errors.append(f"{' '.join(path)}: {name} before a command")
            return errors
        sub = command.get_command(ctx, name)
        if sub is None:
            known = ", ".join(command.list_commands(ctx))
            return [f"{' '.join(path)} has no command {name!r} (it has {known})"]
        path.append(name)
        ctx = click.Context(sub, parent=ctx, info_name=name)
        command = sub
        if isinstance(command, click.Group) and words and not words[0].startswith("-") and words[0] != "...":
            continue
        break
    assert command is not None
    accepted = _flags(command, ctx)
    for word in words:
        if word == "--":
            break
        if not word.startswith("--"):
            continue
        # `--spin/--no-spin` and `--with-backbone\|--features-in` name two flags; `--beam=3` one
        for flag in _FLAG.findall(word.split("=")[0]):
            if flag not in accepted:
                errors.append(f"`{' '.join(path)}` has no flag {flag!r}")
    return errors


def _all_uses() -> list[Use]:
    return [u for doc in DOCS for u in uses(doc.read_text(encoding="utf-8"), doc.relative_to(ROOT).as_posix())]


def test_the_docs_name_many_commands():
    """The extraction finds the docs' commands at all: every top-level command is written somewhere."""
    seen = {u.words[0] for u in _all_uses() if u.words}
    assert set(COMMANDS) <= seen, sorted(set(COMMANDS) - seen)


def test_every_command_and_flag_in_the_docs_exists():
    errors = [f"{u.where}: {e}  [edgecap {' '.join(u.words)}]" for u in _all_uses() for e in problems(u)]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize(
    ("doc", "bad"),
    [
        ("Run `edgecap bench --bundle b --made-up-flag 3`.", "--made-up-flag"),
        ("```bash\nedgecap caption img.jpg \\\n  --no-such-thing\n```\n", "--no-such-thing"),
        ("`edgecap frobnicate --out x`", "frobnicate"),
        ("`edgecap data synth --made-up`", "--made-up"),
        ("`edgecap data nosuch`", "nosuch"),
        ("`edgecap bench --no-tegrastat`", "--no-tegrastat"),
        ("`edgecap caption/bench --made-up`", "--made-up"),
        ("`edgecap caption IMG [--spin/--no-spinn]`", "--no-spinn"),
        ("`edgecap export [--with-backbone\\|--features-on]`", "--features-on"),
        ("Here:\n\n```\nedgecap train --epochs 1 --made-up 2  # a comment --ok\n```\n", "--made-up"),
    ],
)
def test_the_checker_rejects_what_the_cli_lacks(doc, bad):
    found = uses(doc, "synthetic.md")
    assert found and any(bad in e for u in found for e in problems(u)), found


def test_the_checker_accepts_secondary_names_and_skips_what_is_not_a_command():
    doc = (
        "`edgecap bench --bundle b --no-tegrastats --tegrastats`, `edgecap caption I [--spin/--no-spin]`, "
        "`python -m edgecap data synth --help`, "
        "`edgecap --version`, `pip install edgecap onnx`, `edgecap/cli/`, `edgecap[train]`, "
        "`edgecap caption IMG --beam=3 | head`, install\n`edgecap onnx`\n\n"
        "```python\nrun(['edgecap', 'bench', '--made-up'])  # edgecap bench --made-up\n```\n"
        "```text\n| edgecap torch | edgecap ORT |\n```\n"
    )
    found = uses(doc, "synthetic.md")
    assert [u.words[0] for u in found] == ["bench", "caption", "data", "--version", "caption"], found
    assert not [e for u in found for e in problems(u)]


def _option(command: str, name: str) -> click.Option:
    cmd = main.get_command(click.Context(main), command)
    assert cmd is not None
    (option,) = [p for p in cmd.params if isinstance(p, click.Option) and name in p.opts]
    return option


def _help(command: str) -> str:
    result = CliRunner().invoke(main, [command, "--help"], terminal_width=1000)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_bench_step_mode_choices_are_the_registry_s():
    option = _option("bench", "--step-mode")
    assert isinstance(option.type, click.Choice)
    assert tuple(option.type.choices) == (*STEP_MODES, "auto")


def test_bench_help_says_the_real_default_runtimes():
    """An empty ``--runtime`` measures every registered runtime (``BenchCfg``); the help says so and lists them."""
    from edgecap.bench.run import BenchCfg

    assert BenchCfg(bundles=("b",)).runtimes == tuple(list_runtimes())
    text = _help("bench")
    assert "Default: every registered runtime" in text
    assert ", ".join(list_runtimes()) in text


def test_engine_precision_choices_match_the_readme():
    option = _option("engine", "--precision")
    assert isinstance(option.type, click.Choice) and tuple(option.type.choices) == PRECISIONS
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    written = re.findall(r"edgecap engine [^`]*?--precision ([a-z0-9\\|]+)", readme)
    assert written, "the README no longer shows `edgecap engine --precision`"
    for choices in written:
        assert tuple(choices.replace("\\", "").split("|")) == PRECISIONS, choices


def test_export_int8_step_choices_match_the_readme():
    from edgecap.workshop.export.calibration.presets import STEP_SCHEMES

    option = _option("export", "--int8-step")
    assert isinstance(option.type, click.Choice) and tuple(option.type.choices) == tuple(STEP_SCHEMES)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    written = re.findall(r"`--int8-step ([a-z0-9|-]+)`", readme)
    assert written and all(tuple(w.split("|")) == tuple(STEP_SCHEMES) for w in written), written
