"""How far a bundle's pooled embeddings move for what a static camera sees and for real changes: the numbers the
on-change threshold (``--on-change``, ``ChangeGate``) is chosen from (``docs/streams.md``, "Sampling and on-change"):

    python -m tools.stream_threshold --model acort-xsmall --precision int8

The scenes are the built-in synthetic dataset's (:mod:`tools.stream_clips`), 640×480. For each scene, the
cosine distance between the pooled embedding (:func:`~edgecap.runtime.stream.sampling.pooled_embedding`) of the
clean scene and of:

- ``video frames``: its frames in an H.264 clip (10 fps, 1 s per scene, sensor noise σ 3) against the first one,
  what a static camera's file gives the gate;
- ``noise σ N``: frames with fresh Gaussian sensor noise of N levels against the first of them;
- ``exposure ±5/10 %``: the whole picture 5 or 10 % darker or brighter (a camera's auto exposure);
- ``pan 16 px``: the picture shifted sideways (a camera's shake);
- ``quarter`` / ``half replaced``: a quarter or half of the picture showing another scene (something came in);
- ``other scene``: every other scene (a change of scene).

The first rows are what a threshold must stay above, the last what it should catch. Results print as markdown;
``--json FILE`` keeps them.
"""

from __future__ import annotations

import itertools
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import numpy as np

from tools import run_program
from tools.stream_clips import Clip, render_scenes, write_clip

__all__ = ["distances", "main"]

#: The conditions, in the order printed: (name, whether a threshold should let it through).
CONDITIONS = (
    ("video frames", False),
    ("noise σ 3", False),
    ("noise σ 8", False),
    ("noise σ 15", False),
    ("exposure ±5/10 %", False),
    ("pan 16 px", False),
    ("quarter replaced", True),
    ("half replaced", True),
    ("other scene", True),
)


def distances(embed: Callable[[list[np.ndarray]], np.ndarray], scenes: list[np.ndarray], clip_path: Path | None,
              seed: int = 0) -> dict[str, list[float]]:  # fmt: skip
    """Cosine distances per condition (:data:`CONDITIONS`); ``embed`` maps H×W×3 uint8 images to (N, D)
    embeddings; ``clip_path``: an H.264 clip of ``scenes`` at 10 fps, 1 s each (None: no ``video frames`` row)."""
    from edgecap.runtime.stream.sampling import cosine_distance

    rng = np.random.default_rng(seed)
    out: dict[str, list[float]] = {name: [] for name, _ in CONDITIONS}
    height, width = scenes[0].shape[:2]

    def against(name: str, base: np.ndarray, others: list[np.ndarray]) -> None:
        vectors = embed([base, *others])
        out[name] += [cosine_distance(vectors[0], v) for v in vectors[1:]]

    for k, scene in enumerate(scenes):
        flat = scene.astype(np.float32)
        for sigma in (3, 8, 15):  # a static camera: one noisy frame against the next ones
            noisy = [np.clip(flat + rng.normal(0, sigma, flat.shape), 0, 255).astype(np.uint8) for _ in range(5)]
            against(f"noise σ {sigma}", noisy[0], noisy[1:])
        against("exposure ±5/10 %", scene, [np.clip(flat * g, 0, 255).astype(np.uint8) for g in (0.9, 0.95, 1.05, 1.1)])
        against("pan 16 px", scene, [np.roll(scene, 16, axis=1), np.roll(scene, -16, axis=1)])
        quarters, halves = [], []
        for j, other in enumerate(scenes):
            if j != k:
                quarter, half = scene.copy(), scene.copy()
                quarter[height // 2 :, width // 2 :] = other[height // 2 :, width // 2 :]
                half[:, width // 2 :] = other[:, width // 2 :]
                quarters.append(quarter)
                halves.append(half)
        against("quarter replaced", scene, quarters)
        against("half replaced", scene, halves)
    vectors = embed(scenes)
    out["other scene"] = [cosine_distance(a, b) for a, b in itertools.combinations(vectors, 2)]
    if clip_path is not None:
        from edgecap.runtime.stream.sources import open_source

        source = open_source(clip_path)
        try:
            frames = list(source)
        finally:
            source.close()
        for start in range(0, len(frames), 10):  # one scene's frames against its first
            vectors = embed([f.image for f in frames[start : start + 10]])
            out["video frames"] += [cosine_distance(vectors[0], v) for v in vectors[1:]]
    return out


def summarise(found: dict[str, list[float]], threshold: float) -> dict[str, dict[str, float]]:
    """min, median, max per condition and the share of distances at or above ``threshold`` (what it lets through)."""
    return {
        name: {
            "n": len(values),
            "min": float(np.min(values)),
            "p50": float(np.median(values)),
            "max": float(np.max(values)),
            "passed": float(np.mean(np.asarray(values) >= threshold)),
        }
        for name, values in found.items()
        if values
    }


def markdown(model: str, rows: dict[str, dict[str, float]], threshold: float) -> str:
    lines = [
        f"### {model}",
        "",
        f"| condition | n | min | median | max | ≥ {threshold:g} |",
        "|---|---|---|---|---|---|",
    ]
    for name, _ in CONDITIONS:
        if name in rows:
            r = rows[name]
            lines.append(
                f"| {name} | {r['n']:.0f} | {r['min']:.4f} | {r['p50']:.4f} | {r['max']:.4f} | {r['passed']:.0%} |"
            )
    return "\n".join(lines)


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--model", multiple=True, help="Bundle directory or name, repeatable [default: acort-xsmall].")
@click.option("--precision", default="auto", show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--scenes", type=click.IntRange(min=2), default=6, show_default=True, help="Synthetic scenes.")
@click.option(
    "--size", type=click.IntRange(min=224), default=480, show_default=True, help="Scene height; frames are 4:3."
)
@click.option("--threshold", type=float, default=None, help="The threshold judged [default: ChangeGate's].")
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None, help="Also write the results here.")
def cli(**options: Any) -> int:
    from edgecap.runtime.captioner import Captioner
    from edgecap.runtime.stream.sampling import DEFAULT_CHANGE_THRESHOLD, pooled_embedding

    args = SimpleNamespace(**options)
    threshold = DEFAULT_CHANGE_THRESHOLD if args.threshold is None else args.threshold
    scenes = render_scenes(args.scenes, seed=1, height=args.size)
    width = args.size * 4 // 3
    results: dict[str, Any] = {"threshold": threshold, "models": {}}
    with tempfile.TemporaryDirectory(prefix="edgecap-threshold-") as tmp:
        clip = Clip(float(args.scenes), 10.0, width, args.size, tuple(float(k) for k in range(args.scenes)))
        clip_path = write_clip(Path(tmp) / "scenes.mp4", clip, scenes)
        canvases = [_canvas(scene, width) for scene in scenes]
        for model in args.model or ["acort-xsmall"]:
            with Captioner.load(model, precision=args.precision, threads=args.threads) as cap:

                def embed(images: list[np.ndarray], cap: Any = cap) -> np.ndarray:
                    return np.concatenate([pooled_embedding(cap, cap.inputs(images[i : i + 8])) for i in
                                           range(0, len(images), 8)])  # fmt: skip

                rows = summarise(distances(embed, canvases, clip_path), threshold)
                results["models"][model] = {"runtime": cap.runtime_info.get("summary"), "distances": rows}
            print(markdown(model, rows, threshold) + "\n", flush=True)
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _canvas(scene: np.ndarray, width: int) -> np.ndarray:
    """A scene as the clip shows it: centred on a 4:3 frame, its edges extended sideways."""
    pad = width - scene.shape[1]
    return np.pad(scene, ((0, 0), (pad // 2, pad - pad // 2), (0, 0)), mode="edge")


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.stream_threshold ARGV``: the exit status."""
    return run_program(cli, argv)


if __name__ == "__main__":
    sys.exit(main())
