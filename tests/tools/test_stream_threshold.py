"""The on-change calibration benchmark (tools.stream_threshold) on the tiny pixels-in bundle: every condition
measured, the table printed, the JSON written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.runtime.bundle.helpers import pixel_bundle
from tools.stream_threshold import CONDITIONS, distances, main, summarise


def test_the_calibration_measures_every_condition(
    tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    bundle, _ = pixel_bundle(tiny_data, tmp_path_factory)
    out = tmp_path / "threshold.json"
    assert (
        main(["--model", str(bundle), "--scenes", "3", "--size", "224", "--threshold", "0.001", "--json", str(out)])
        == 0
    )
    table = capsys.readouterr().out
    assert all(f"| {name} |" in table for name, _ in CONDITIONS) and "≥ 0.001" in table
    results = json.loads(out.read_text())
    rows = results["models"][str(bundle)]["distances"]
    assert results["threshold"] == 0.001 and set(rows) == {name for name, _ in CONDITIONS}
    assert rows["video frames"]["n"] == 27 and rows["other scene"]["n"] == 3  # 3 scenes × 9 frames; 3 pairs
    assert all(0.0 <= r["min"] <= r["p50"] <= r["max"] <= 2.0 and 0.0 <= r["passed"] <= 1.0 for r in rows.values())


def test_distances_on_a_known_embedding() -> None:
    """An embedding that is the mean colour: noise and a pan barely move it, another scene moves it far."""
    scenes = [np.full((24, 32, 3), c, np.uint8) for c in ((200, 20, 20), (20, 20, 200))]

    def embed(images: list[np.ndarray]) -> np.ndarray:
        return np.stack([i.reshape(-1, 3).mean(0) for i in images])

    rows = summarise(distances(embed, scenes, None), threshold=0.1)
    assert "video frames" not in rows and rows["pan 16 px"]["max"] < 1e-9
    assert rows["noise σ 15"]["max"] < 0.01 and rows["other scene"]["min"] > 0.5
    assert rows["other scene"]["passed"] == 1.0 and rows["noise σ 3"]["passed"] == 0.0
