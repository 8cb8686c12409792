"""Version strings of installed software as :class:`packaging.version.Version`, one parser for every check.

Installed packages report versions such as ``1.20.0.dev20240101`` (nightlies), ``2.4.1+cpu`` / ``1.18.1+cu118``
(local builds) and ``10.3.0.30`` (TensorRT's four parts); :pep:`440` orders them all, so edgecap compares through
``packaging`` rather than its own regular expressions. A vendor build whose string is not :pep:`440` (a suffix such
as ``1.18.0-jetson``) is read by its leading release numbers, so a feature check never fails on a label alone.
"""

from __future__ import annotations

import re

from packaging.version import InvalidVersion, Version

__all__ = ["InvalidVersion", "Version", "parse_version", "release"]

_LEADING_RELEASE = re.compile(r"\s*v?(\d+(?:\.\d+)*)")


def parse_version(text: str) -> Version:
    """``text`` as a :class:`Version`; a non-PEP 440 string by its leading release numbers.

    Raises:
        InvalidVersion: ``text`` does not start with a number (a ``ValueError``).
    """
    try:
        return Version(text)
    except InvalidVersion:
        match = _LEADING_RELEASE.match(text)
        if match is None:
            raise
        return Version(match.group(1))


def release(text: str, parts: int) -> tuple[int, ...]:
    """The first ``parts`` release numbers of ``text``, padded with zeros (``"1.9rc1"``, 3 -> ``(1, 9, 0)``): what a
    minimum-version check compares, so a nightly or local build of a release counts as that release."""
    numbers = parse_version(text).release
    return (*numbers[:parts], *(0,) * (parts - len(numbers)))
