"""Hypothesis profiles for the fuzz suite.

``default`` (CI): few examples per loader, the whole suite in about a minute on 2 cores. ``soak``
(``pytest tests/fuzz --hypothesis-profile soak``): thousands of examples per loader, for a nightly or manual run.
Both bound each example's time (``deadline``) so a hang or a pathological slowdown fails the example.
"""

from __future__ import annotations

from datetime import timedelta

from hypothesis import HealthCheck, settings

_COMMON = {
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    "derandomize": False,
    "print_blob": True,
}

settings.register_profile("default", max_examples=40, deadline=timedelta(seconds=5), **_COMMON)
settings.register_profile("soak", max_examples=3000, deadline=timedelta(seconds=10), **_COMMON)
settings.load_profile("default")
