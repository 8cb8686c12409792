"""``print_captions``: what ``edgecap caption`` prints, locally or through a server, and its exit status."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from edgecap.cli.options import print_captions


def _run(captions: dict[str, str | None], as_json: bool):
    @click.command()
    def show() -> None:
        print_captions(captions, as_json)

    return CliRunner().invoke(show)


def test_plain_lines_and_success() -> None:
    result = _run({"a.jpg": "a dog", "b.jpg": "a cat"}, as_json=False)
    assert result.exit_code == 0
    assert result.output.splitlines() == ["a.jpg: a dog", "b.jpg: a cat"]


@pytest.mark.parametrize("as_json", [False, True])
def test_a_missing_caption_is_counted_and_fails(as_json: bool) -> None:
    result = _run({"a.jpg": "a dog", "bad.jpg": None}, as_json=as_json)
    assert result.exit_code == 1
    assert "1 of 2 image(s) could not be captioned" in result.output
    if as_json:
        body = result.output[: result.output.rindex("}") + 1]
        assert json.loads(body) == {"a.jpg": "a dog", "bad.jpg": None}
    else:
        assert "bad.jpg" not in result.output.split("could not")[0]
