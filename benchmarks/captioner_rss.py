"""Peak resident memory of a process that loads a bundle with ``Captioner.load`` and captions N images.

Each (runtime, precision) runs in a fresh interpreter so the peaks do not mix; VmHWM is read from
``/proc/self/status`` after captioning. Usage::

    python benchmarks/captioner_rss.py BUNDLE IMAGES_DIR [--images 100] [--precision fp32,int8] [--runtime onnxruntime]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
from pathlib import Path
t0 = time.perf_counter()
from edgecap import Captioner
bundle, images_dir, n, runtime, precision = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
images = sorted(p for p in Path(images_dir).iterdir() if p.suffix.lower() in {".png", ".jpg", ".jpeg"})[:n]
with Captioner.load(bundle, runtime=runtime, precision=precision) as cap:
    loaded = time.perf_counter()
    captions = cap.batch([str(p) for p in images])
    done = time.perf_counter()
    info = cap.runtime_info["summary"]
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"runtime": info, "images": len(captions), "peak_rss_mb": round(hwm / 1024, 1),
                  "load_s": round(loaded - t0, 2), "caption_s": round(done - loaded, 2)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("images")
    parser.add_argument("--images", dest="count", type=int, default=100)
    parser.add_argument("--precision", default="fp32,fp16,int8")
    parser.add_argument("--runtime", default="onnxruntime")
    args = parser.parse_args()
    rows = []
    for runtime in args.runtime.split(","):
        for precision in args.precision.split(","):
            started = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-c", CHILD, args.bundle, args.images, str(args.count), runtime, precision],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row.update(requested=f"{runtime}/{precision}", wall_s=round(time.perf_counter() - started, 2))
            rows.append(row)
    print("| requested | runtime chosen | images | peak RSS (MB) | load (s) | caption (s) |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        cells = [r["requested"], r["runtime"], r["images"], r["peak_rss_mb"], r["load_s"], r["caption_s"]]
        print("| " + " | ".join(str(c) for c in cells) + " |")


if __name__ == "__main__":
    main()
