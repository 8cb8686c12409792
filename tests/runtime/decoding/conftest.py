"""Every decoding test runs once per array type the search accepts from a step model (``fakes.BACKEND``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.runtime.decoding import fakes


@pytest.fixture(autouse=True, params=["numpy", "torch"])
def array_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """The array type the fake step models return (torch cases skip where torch is not installed)."""
    if request.param == "torch":
        pytest.importorskip("torch")
    previous, fakes.BACKEND = fakes.BACKEND, request.param
    try:
        yield request.param
    finally:
        fakes.BACKEND = previous
