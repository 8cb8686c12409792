"""The part of a parity report a bundle's manifest keeps (written by export, read by ``edgecap bench`` and users)."""

from __future__ import annotations

from edgecap.workshop.export.parity import parity_summary


def test_parity_summary_keeps_the_numbers_and_tolerances():
    report = {
        "graph": "step",
        "passed": True,
        "feeds": 2,
        "sizes": [{"batch": 1}],
        "runs": [{"tokens": [1]}],
        "outputs": {
            "logprobs": {
                "max_abs": 1e-6,
                "mean_abs": 1e-7,
                "max_rel": 1e-5,
                "violations": 0,
                "elements": 10,
                "never": 4,
                "atol": 1e-4,
                "rtol": 1e-4,
                "passed": True,
                "worst_feed": 0,
            }
        },
    }
    summary = parity_summary(report)
    assert summary["passed"] is True and summary["feeds"] == 2 and "runs" not in summary
    assert summary["outputs"]["logprobs"] == {
        "max_abs": 1e-6,
        "mean_abs": 1e-7,
        "max_rel": 1e-5,
        "violations": 0,
        "never": 4,  # the -1e4 entries left out of the statistics, so the manifest says why max_abs is small
        "atol": 1e-4,
        "rtol": 1e-4,
        "passed": True,
    }
