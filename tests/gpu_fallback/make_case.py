"""The case the onnxruntime-gpu fallback tests caption: a tiny pixels-in bundle (FP32 + FP16 graphs, so a precision
planned for TensorRT would differ), a few images, and the captions the CPU provider gives them at FP32.

``.ci/onnxruntime-gpu`` runs it with the development environment (torch and onnx export the bundle; the CPU
onnxruntime captions it, an independent reference for the onnxruntime-gpu wheel under test)::

    python -m tests.gpu_fallback.make_case DIR

writes ``DIR/bundle``, ``DIR/images/`` and ``DIR/case.json`` (``{"bundle", "images", "expected"}``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

#: Images captioned (the first of the synthetic dataset's images, by name).
IMAGES = 3


class _Dirs:
    """The ``mktemp`` of pytest's ``tmp_path_factory``, under one directory (tests.runtime.bundle.helpers takes a
    factory)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def mktemp(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True)
        return path


def make_case(root: Path) -> dict[str, Any]:
    """Build the case under ``root`` (which must not hold one yet) and return what ``case.json`` holds."""
    import warnings

    from edgecap import Captioner
    from edgecap.cli import main
    from edgecap.workshop.data.synthetic import generate_dataset
    from tests.runtime.bundle.helpers import pixel_run

    root.mkdir(parents=True, exist_ok=True)
    generate_dataset(root / "data", 12, seed=3, progress=False)
    data = root / "data"
    run, weights = pixel_run((data, None), _Dirs(root / "work"))  # type: ignore[arg-type]
    bundle = root / "bundle"
    args = ["export", "--model", str(run), "--backbone-weights", str(weights), "--out", str(bundle)]
    main.main([*args, "--fp16", "--quality-images", "0", "--quiet", "--threads", "1"], standalone_mode=False)
    images = sorted((data / "images").iterdir())[:IMAGES]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Captioner.load(bundle, runtime="onnxruntime", precision="fp32", providers=["cpu"]) as cap:
            expected = cap.batch([str(p) for p in images])
    case = {"bundle": str(bundle), "images": [str(p) for p in images], "expected": expected}
    (root / "case.json").write_text(json.dumps(case, indent=2))
    return case


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.gpu_fallback.make_case DIR")
    made = make_case(Path(sys.argv[1]))
    print(f"case: {made['bundle']}, {len(made['images'])} images, expected {made['expected']}")
