"""Soak: one ``Captioner`` serving several threads for minutes on a mix of good and bad images.

Checks, for the whole run (:func:`run_soak`):

* every good image is captioned without error, and every caption equals the serial caption of the same image
  (computed once, before the threads start);
* every bad image (truncated PNG/JPEG, garbage bytes, an empty file, text named ``.png``, a JPEG header on PNG
  data) raises ``ImageError`` — counted; any other exception is a failure;
* resident memory (RSS, sampled every second: psutil when installed, else ``VmRSS`` of ``/proc/self/status``)
  grows by at most ``rss_bound_mb`` between the end of the warm-up and the end of the run.

The job is ``tests/jobs/test_soak.py`` (``python -m pytest -m soak``; docs/benchmarks.md, "Soak"), which writes the
report and its markdown summary where ``EDGECAP_SOAK_OUT`` says.
"""

from __future__ import annotations

import io
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from edgecap import Captioner
from edgecap.runtime.images.load import ImageError
from tools.files import write_json, write_text


def rss_mb() -> float:
    """This process's resident memory in MiB."""
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def _picture(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    base = np.linspace(0, 255, width, dtype=np.float32)[None, :, None] * rng.uniform(0.2, 1.0, size=(1, 1, 3))
    noise = rng.normal(0, 20, size=(height, width, 3))
    image = Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(1, 5))):
        x, y = int(rng.integers(0, width - 8)), int(rng.integers(0, height - 8))
        size = int(rng.integers(6, max(8, min(width, height) // 2)))
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x, y, x + size, y + size], fill=colour)
    return image


def _encode(image: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **({"quality": 85} if fmt == "JPEG" else {}))
    return buf.getvalue()


def make_images(folder: Path, good: int, bad: int, seed: int) -> tuple[list[Path], list[Path]]:
    """``good`` valid PNG/JPEG files of varied sizes and ``bad`` broken ones, under ``folder``."""
    rng = np.random.default_rng(seed)
    good_paths, bad_paths = [], []
    for i in range(good):
        fmt = "PNG" if i % 2 == 0 else "JPEG"
        size = (int(rng.integers(48, 400)), int(rng.integers(48, 400)))
        path = folder / f"good-{i:03d}.{fmt.lower()}"
        path.write_bytes(_encode(_picture(rng, *size), fmt))
        good_paths.append(path)
    kinds = ["truncated-png", "truncated-jpeg", "garbage", "empty", "text", "spliced"]
    for i in range(bad):
        kind = kinds[i % len(kinds)]
        png, jpeg = _encode(_picture(rng, 96, 80), "PNG"), _encode(_picture(rng, 96, 80), "JPEG")
        data = {
            "truncated-png": png[: len(png) // 2],
            "truncated-jpeg": jpeg[: len(jpeg) // 2],
            "garbage": rng.integers(0, 256, size=int(rng.integers(1, 4096)), dtype=np.uint8).tobytes(),
            "empty": b"",
            "text": b"<html>not an image</html>\n",
            "spliced": jpeg[:200] + png[200:],
        }[kind]
        path = folder / f"bad-{i:03d}-{kind}.{'jpg' if 'jpeg' in kind else 'png'}"
        path.write_bytes(data)
        bad_paths.append(path)
    return good_paths, bad_paths


class Soak:
    """The threads calling one Captioner and the RSS sampler, with what they counted."""

    def __init__(self, cap: Captioner, good: dict[str, str], bad: list[str], seconds: float, threads: int) -> None:
        self.cap, self.good, self.bad, self.seconds, self.threads = cap, good, bad, seconds, threads
        self.lock = threading.Lock()
        self.counts = {"good": 0, "bad_image_error": 0}
        self.mismatches: list[dict[str, str]] = []
        self.errors: list[dict[str, str]] = []
        self.rss: list[tuple[float, float]] = []
        self.stop = threading.Event()

    def _worker(self, seed: int) -> None:
        rng = random.Random(seed)
        names = [*self.good, *self.bad]
        while not self.stop.is_set():
            path = rng.choice(names)
            key: str | None
            problem: Exception | None
            try:
                caption = self.cap(path)
            except ImageError as exc:
                key, problem = ("bad_image_error", None) if path in self.bad else (None, exc)
            except Exception as exc:  # noqa: BLE001 - every other exception is a failure, recorded
                key, problem = None, exc
            else:
                if path in self.good:
                    key, problem = "good", None
                    if caption != self.good[path]:
                        with self.lock:
                            self.mismatches.append({"image": path, "serial": self.good[path], "threaded": caption})
                else:
                    key, problem = None, AssertionError(f"bad image was captioned: {caption!r}")
            with self.lock:
                if key is not None:
                    self.counts[key] += 1
                if problem is not None:
                    self.errors.append({"image": path, "error": f"{type(problem).__name__}: {problem}"[:300]})

    def _sampler(self, start: float) -> None:
        while not self.stop.wait(1.0):
            self.rss.append((time.perf_counter() - start, rss_mb()))

    def run(self) -> float:
        """Run the threads and the sampler for ``seconds``; returns the seconds it took."""
        start = time.perf_counter()
        self.rss.append((0.0, rss_mb()))
        workers = [threading.Thread(target=self._worker, args=(i,), daemon=True) for i in range(self.threads)]
        sampler = threading.Thread(target=self._sampler, args=(start,), daemon=True)
        for t in [sampler, *workers]:
            t.start()
        self.stop.wait(self.seconds)
        self.stop.set()
        for t in [*workers, sampler]:
            t.join()
        return time.perf_counter() - start


def rss_summary(samples: list[tuple[float, float]], warmup_s: float, bound_mb: float) -> dict[str, Any]:
    """Growth of the (seconds, MiB) samples after the warm-up, judged against ``bound_mb`` (None: too few samples)."""
    after = [(t, mb) for t, mb in samples if t >= warmup_s]
    if len(after) < 4:
        return {"samples": len(samples), "note": "run too short for a growth figure", "passed": None}
    head = statistics.median(mb for _, mb in after[:5])
    tail = statistics.median(mb for _, mb in after[-5:])
    slope = float(np.polyfit([t for t, _ in after], [mb for _, mb in after], 1)[0]) * 60
    growth = tail - head
    return {
        "samples": len(samples),
        "warmup_s": warmup_s,
        "start_mb": round(samples[0][1], 1),
        "after_warmup_mb": round(head, 1),
        "end_mb": round(tail, 1),
        "peak_mb": round(max(mb for _, mb in samples), 1),
        "growth_after_warmup_mb": round(growth, 1),
        "slope_mb_per_min": round(slope, 2),
        "bound_mb": bound_mb,
        "passed": growth <= bound_mb,
    }


def markdown(report: dict[str, Any]) -> str:
    """The report as a short markdown summary."""
    r, rss = report, report["rss"]
    lines = [
        f"# Soak: one Captioner, {r['threads']} threads, mixed images ({r['seconds']:.0f} s)",
        "",
        f"- bundle `{r['bundle']}` ({r['runtime']}), {r['good_images']} good + {r['bad_images']} bad images",
        f"- calls: {r['counts']['good']} good captioned, {r['counts']['bad_image_error']} bad → ImageError "
        f"({r['calls_per_s']:.1f} calls/s)",
        f"- caption ≠ serial caption: {len(r['mismatches'])}; other errors: {len(r['errors'])}",
        f"- RSS: {rss.get('after_warmup_mb')} MB after {rss.get('warmup_s')} s warm-up → {rss.get('end_mb')} MB at "
        f"the end (growth {rss.get('growth_after_warmup_mb')} MB, bound {rss.get('bound_mb')} MB; "
        f"slope {rss.get('slope_mb_per_min')} MB/min; peak {rss.get('peak_mb')} MB)",
        f"- **{'PASS' if r['passed'] else 'FAIL'}**",
    ]
    return "\n".join(lines) + "\n"


def run_soak(
    bundle: str | Path,
    *,
    minutes: float = 10.0,
    threads: int = 4,
    good: int = 24,
    bad: int = 12,
    precision: str = "auto",
    warmup_s: float | None = None,
    rss_bound_mb: float = 20.0,
    seed: int = 0,
) -> dict[str, Any]:
    """Soak ``bundle`` (a directory or a name under ``$EDGECAP_HOME/bundles``) and return the report; ``passed`` is
    False when a caption differed from its serial one, a call failed otherwise than a bad image's ``ImageError``, or
    RSS grew past the bound after the warm-up (default: 25% of the run, at most 60 s)."""
    seconds = minutes * 60
    warmup = warmup_s if warmup_s is not None else min(60.0, 0.25 * seconds)
    with (
        tempfile.TemporaryDirectory(prefix="edgecap-soak-") as tmp,
        Captioner.load(bundle, precision=precision) as cap,
    ):
        good_paths, bad_paths = make_images(Path(tmp), good, bad, seed)
        serial = {str(p): cap(str(p)) for p in good_paths}
        for p in bad_paths:  # the serial run must agree on which images are bad
            try:
                cap(str(p))
            except ImageError:
                continue
            raise ValueError(f"{p.name}: expected ImageError in the serial pass")
        soak = Soak(cap, serial, [str(p) for p in bad_paths], seconds, threads)
        elapsed = soak.run()
        runtime = str(cap.runtime_info.get("summary", ""))
    rss = rss_summary(soak.rss, warmup, rss_bound_mb)
    calls = soak.counts["good"] + soak.counts["bad_image_error"]
    report = {
        "bundle": str(bundle),
        "runtime": runtime,
        "threads": threads,
        "seconds": round(elapsed, 1),
        "good_images": len(good_paths),
        "bad_images": len(bad_paths),
        "distinct_serial_captions": len(set(serial.values())),
        "counts": soak.counts,
        "calls_per_s": calls / elapsed,
        "mismatches": soak.mismatches[:20],
        "errors": soak.errors[:20],
        "mismatch_count": len(soak.mismatches),
        "error_count": len(soak.errors),
        "rss": rss,
        "rss_series_mb": [[round(t, 1), round(mb, 1)] for t, mb in soak.rss],
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()},
    }
    report["passed"] = not soak.mismatches and not soak.errors and rss.get("passed") is not False
    return report


def write_soak_report(report: dict[str, Any], out: Path) -> None:
    """``OUT/soak.json`` and ``OUT/soak.md``, each written atomically."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "soak.json", report)
    write_text(out / "soak.md", markdown(report))
