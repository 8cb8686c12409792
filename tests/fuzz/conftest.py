"""Hypothesis profiles for the fuzz suite.

``default`` (CI): few examples per loader, the whole suite in about a minute on 2 cores, derandomised so that a CI
failure is the code's and reproduces. ``soak`` (``pytest tests/fuzz --hypothesis-profile soak``): thousands of random
examples per loader, for a nightly or manual run that looks for new failures.
Both bound each example's time (``deadline``) so a hang or a pathological slowdown fails the example.
"""

from __future__ import annotations

from datetime import timedelta

from hypothesis import HealthCheck, settings

_COMMON = {
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    "print_blob": True,
}

settings.register_profile("default", max_examples=40, deadline=timedelta(seconds=5), derandomize=True, **_COMMON)
settings.register_profile("soak", max_examples=3000, deadline=timedelta(seconds=10), derandomize=False, **_COMMON)
settings.load_profile("default")
