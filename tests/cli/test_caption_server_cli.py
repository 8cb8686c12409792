"""``edgecap caption --server``: what the command says for a bad URL or a model the server does not serve."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from edgecap.cli import main

pytest.importorskip("tritonclient.http", reason="the [client] extra (tritonclient) is not installed")

from tests.runtime.serving.fakes import FakeTriton  # noqa: E402


@pytest.mark.parametrize("url", ["http://[::1", "grpc://[::1", "http://h:port"])
def test_a_malformed_server_url_is_one_line(url: str, tmp_path: Path) -> None:
    image = tmp_path / "x.jpg"
    image.write_bytes(b"x")
    result = CliRunner().invoke(main, ["caption", str(image), "--server", url])
    assert result.exit_code != 0 and isinstance(result.exception, SystemExit)
    assert result.stderr.startswith("Error: server URL must be http://HOST:PORT"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_a_model_the_server_does_not_serve_stops_the_command(tmp_path: Path) -> None:
    images = [tmp_path / f"{i}.jpg" for i in range(3)]
    for image in images:
        image.write_bytes(b"x")
    with FakeTriton("real", "READY") as fake:
        result = CliRunner().invoke(main, ["caption", *map(str, images), "--server", fake.url, "--model", "wrong"])
    assert result.exit_code == 1
    assert result.stderr.strip() == f"Error: {fake.url} does not serve a model 'wrong'; it serves real"
    assert fake.infers <= 3  # one per image at most (they are sent concurrently): none retried
