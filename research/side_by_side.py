"""Side by side: edgecap's runtimes against the official ACORT / ExpansionNet v2 code and a re-run-prefix stand-in,
in captions/s, with one command.

Every number of the CPU decoding table (``docs/cpu-benchmarks.md``, "Side by side") is re-measured here:

- **models**: the paper settings (``edgecap.workshop.models.paper_settings``: the paper's feature dim and 10,001-word
  vocabulary) with seeded random weights, a 7x7 grid of features (``tools.random_models.random_setup``);
  ``acort-xsmall`` decodes 26 forced radix tokens, ``expansionnet-v2`` 19 forced words (``min_len = steps - 1``,
  ``max_len = steps``: no caption ends early). Each decode is the full path from features to token
  ids, encoder included.
- **columns**: the *official code* (``--official-acort PATH``, ``--official-expansionnet PATH``: a checkout of the
  official repository at the commit in ``OFFICIAL_CODE``; its model built at the row's architecture with
  its own random init, its own decode function and beam search timed on the same features: ``py``;
  skipped with a note when no path is given), the *re-run-prefix stand-in* (edgecap's model and search in torch eager
  through :class:`~edgecap.workshop.torch_runtime.prefix.PrefixRerunStepModel`: no cache, the whole prefix re-run every
  step),
  edgecap torch (:class:`~edgecap.workshop.torch_runtime.runtime.TorchStepModel`), and one edgecap ONNX
  Runtime column per exported variant (``--variants``, default ``fp32,int8``). A variant is an ``export_onnx``
  precision (``fp32``, ``fp16``) or ``int8[:PRESET]``: static INT8 quantised by
  :func:`edgecap.workshop.export.calibration.quantize_int8` with that registered preset (default ``cpu-auto``), so a
  preset another
  change registers (another step scheme, other bits) becomes a column by name; ``exported`` adds every variant the
  export folders already hold. Every edgecap column (stand-in, torch, ONNX Runtime) runs the same beam search; the
  official
  code runs its own, with its end token set to an id the model cannot emit so that it too decodes the forced length.
  Table ratios are to the official code's column (to the stand-in's when no checkout was given).
- **rows**: threads × batch × strategy (greedy, beam 3). One cell = one row × one column, run in a **fresh process**
  (``--cell``): 2 untimed warm-up decodes, then 7 timed ones, their median. Cells are interleaved in rounds
  (``--rounds``): every round runs every cell once, rotating the column order, so a drifting load hits all columns;
  a cell's value is the median of its round medians, and the spread (min–max of the round medians) is reported.
- **export once**: each model's weights and graphs go into ``--work`` (``MODEL-SETTING-seedN/variants.json`` lists the
  variants and their files) and every cell process reads them; a later run reuses what is there, unless edgecap's
  sources changed since.
- **weight-read limit**: per variant, the bytes of the step graph's initializers read whole (embedding tables only a
  ``Gather`` indexes are left out: a step reads a row of them), this
  machine's streaming read rate (numpy over a buffer that fits the L3 and one 8x larger; the L3 size from
  ``/sys/devices/system/cpu/cpu0/cache``) and the limit = bytes / rate (the L3 rate when the weights fit the L3,
  else the DRAM rate). The step graph alone is timed with ONNX Runtime on one thread, at batch 1, on the inputs of a
  mid-caption step (greedy: 1 row; beam 3: 3 rows), and compared with the limit (``--limit-only``: this part alone).
  Beside it, the floor ONNX Runtime's kernels set (``tools.kernel_floor``): the step's weight matmuls alone,
  in one graph, on the same inputs.

Writes ``side_by_side.json`` (every timing) and ``side_by_side.md`` into ``--out``. Usage::

    python -m research.side_by_side --work /tmp/sbs-work --out /tmp/sbs           # default matrix, ~15 min
    python -m research.side_by_side --model acort-xsmall --beam 3 --threads 1 --no-limit \
        --official-acort ~/src/sparse-image-captioning --official-expansionnet ~/src/ExpansionNet_v2
    python -m research.side_by_side --work /tmp/sbs-work --out /tmp/sbs --full    # every model x every row
    python -m research.side_by_side --model acort-xsmall --batch 1 --rounds 3 --variants fp32,int8,int8:cpu-avx2
    python -m research.side_by_side --quick --work /tmp/w --out /tmp/o            # smoke run: tiny model, 1 round
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import numpy as np

OFFICIAL = "official"
BASELINE = "baseline"
TORCH = "torch"
ONNXRUNTIME_PREFIX = "onnxruntime-"
COLUMN_LABELS = {
    OFFICIAL: "official code",
    BASELINE: "re-run-prefix stand-in (no cache)",
    TORCH: "edgecap torch",
}
#: Forced decode steps per model (docs/cpu-benchmarks.md's protocol): radix tokens for ACORT, words for ExpansionNet v2.
FORCED_STEPS = {"acort-xsmall": 26, "expansionnet-v2": 19}
QUICK_MODEL = "acort-test"
QUICK_STEPS = 6
DEFAULT_VARIANTS = ("fp32", "int8")
INT8 = "int8"
#: ``--variants`` entry for every variant already in the export folders.
EXPORTED = "exported"
DEFAULT_PRESET = "cpu-auto"
#: Rows per model by default (a run of <= ~15 min on a 2-core box): every row of ACORT, ExpansionNet v2's cheapest.
#: ``--full`` gives every model the full grid; --threads/--batch/--beam replace an axis for every model.
FULL_GRID = {"threads": (1, 2), "batch": (1, 16), "beam": (1, 3)}
DEFAULT_GRID = {
    "acort-xsmall": FULL_GRID,
    "expansionnet-v2": {"threads": (1,), "batch": (1,), "beam": (3,)},
}
QUICK_GRID = {"threads": (1,), "batch": (1,), "beam": (1, 3)}
WEIGHTS_FILE = "weights.safetensors"
MANIFEST = "variants.json"


# -- the plan ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    """One row of the table: a model decoding ``steps`` forced steps with ``threads`` threads, ``batch`` images per
    call, greedy (``beam`` 1) or beam search."""

    model: str
    steps: int
    threads: int
    batch: int
    beam: int

    @property
    def label(self) -> str:
        strategy = "greedy" if self.beam == 1 else f"beam {self.beam}"
        return f"{self.model}, {strategy}"


def parse_model(text: str) -> tuple[str, int]:
    """``NAME`` (forced steps from :data:`FORCED_STEPS`) or ``NAME:STEPS``."""
    name, _, steps = text.partition(":")
    if steps:
        if not steps.isdigit() or int(steps) < 2:
            raise ValueError(f"--model {text}: STEPS must be an integer >= 2")
        return name, int(steps)
    if name not in FORCED_STEPS:
        raise ValueError(f"--model {text}: no protocol length for {name!r}; write {name}:STEPS")
    return name, FORCED_STEPS[name]


def parse_variant(name: str) -> dict[str, Any]:
    """A variant name -> how it is exported: ``{"precision": p}`` for an ``export_onnx`` precision, or
    ``{"precision": "int8", "preset": PRESET}`` for ``int8`` / ``int8:PRESET`` (a registered INT8 preset)."""
    from edgecap.runtime.precisions import FLOAT_PRECISIONS
    from edgecap.workshop.export.calibration.presets import list_presets

    precision, _, preset = name.partition(":")
    if precision == INT8:
        preset = preset or DEFAULT_PRESET
        if preset not in list_presets():
            raise ValueError(f"variant {name!r}: unknown INT8 preset {preset!r}; choose one of {list_presets()}")
        return {"precision": INT8, "preset": preset}
    if preset or precision not in FLOAT_PRECISIONS:
        choices = [*FLOAT_PRECISIONS, f"{INT8}[:PRESET]"]
        raise ValueError(f"unknown variant {name!r}; choose one of {choices}")
    return {"precision": precision}


def plan_rows(
    models: Sequence[tuple[str, int]],
    *,
    full: bool = False,
    quick: bool = False,
    threads: Sequence[int] | None = None,
    batch: Sequence[int] | None = None,
    beam: Sequence[int] | None = None,
) -> list[Row]:
    """The rows to measure: each model's grid (default, ``full`` or ``quick``) with explicit axes replacing its own."""
    rows = []
    for name, steps in models:
        grid = QUICK_GRID if quick else FULL_GRID if full else DEFAULT_GRID.get(name, FULL_GRID)
        axes = {"threads": threads or grid["threads"], "batch": batch or grid["batch"], "beam": beam or grid["beam"]}
        for value in (v for axis in axes.values() for v in axis):
            if value < 1:
                raise ValueError(f"threads, batch and beam must be >= 1, got {value}")
        for b in axes["beam"]:
            for n in axes["batch"]:
                for t in axes["threads"]:
                    rows.append(Row(name, steps, t, n, b))
    return rows


def ort_variants(requested: Sequence[str], manifests: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The ONNX Runtime columns: the requested variants in order, where ``exported`` stands for every variant the export
    folders list (also those exported by an earlier run with other ``--variants``)."""
    out: list[str] = []
    for name in requested:
        found = [v for m in manifests.values() for v in m["variants"]] if name == EXPORTED else [name]
        out += [v for v in found if v not in out]
    return out


def columns_for(variants: Sequence[str], baseline: bool = True, official: bool = False) -> list[str]:
    """The table's columns: the official code (when a checkout is given), the re-run-prefix stand-in, torch, then one
    ``onnxruntime-VARIANT`` per ONNX Runtime variant."""
    head = [*([OFFICIAL] if official else []), *([BASELINE] if baseline else [])]
    return [*head, TORCH, *(ONNXRUNTIME_PREFIX + v for v in variants)]


def round_cells(rows: Sequence[Row], columns: Sequence[str], round_index: int) -> list[tuple[Row, str]]:
    """The cells of one round: every row, its columns rotated by the round (and the rows reversed every other
    round), so that no column always runs first or right after another's heavy cell."""
    shift = round_index % len(columns)
    rotated = [*columns[shift:], *columns[:shift]]
    ordered_rows = rows if round_index % 2 == 0 else list(reversed(rows))
    return [(row, column) for row in ordered_rows for column in rotated]


# -- export once into --work -----------------------------------------------------------------------------------------
def model_dir(work: Path, model: str, setting: str, seed: int) -> Path:
    return work / f"{model}-{setting}-seed{seed}"


def read_manifest(directory: Path) -> dict[str, Any]:
    """``variants.json`` of an export folder (empty variants when there is none yet)."""
    path = directory / MANIFEST
    if not path.is_file():
        return {"variants": {}}
    return json.loads(path.read_text())


def source_fingerprint() -> str:
    """A digest of edgecap's sources: an export folder made by other code (another step graph, another INT8 preset
    definition) is exported again rather than reused."""
    import edgecap

    digest = hashlib.sha1()
    package = Path(edgecap.__file__).parent
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _numpy_inputs(inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {k: v.numpy() if hasattr(v, "numpy") else np.asarray(v) for k, v in inputs.items()}


def prepare_model(
    work: Path, model: str, steps: int, variants: Sequence[str], seed: int, setting: str, log: Any = print
) -> dict[str, Any]:
    """Export ``model``'s weights and every variant in ``variants`` missing from its folder under ``work``; returns
    the folder's manifest (variant -> graph files relative to the folder)."""
    import torch
    from safetensors.torch import load_model, save_model

    from tools import random_models
    from tools.files import atomic_path, write_bytes, write_json

    directory = model_dir(work, model, setting, seed)
    directory.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(directory)
    fingerprint = source_fingerprint()
    if manifest.get("source") != fingerprint:
        manifest = {"variants": {}}  # other code made (or nothing made) these graphs: export them again
        (directory / WEIGHTS_FILE).unlink(missing_ok=True)
    wanted = [v for v in variants if v not in manifest["variants"]]
    if not wanted and (directory / WEIGHTS_FILE).is_file():
        return manifest
    setup = random_models.random_setup(model, 1, seed, setting)
    weights = directory / WEIGHTS_FILE
    if weights.is_file():
        load_model(setup.model, str(weights))
    else:
        with atomic_path(weights) as tmp:  # written once: every later export and cell uses these weights
            save_model(setup.model, str(tmp))
    manifest.update({"model": model, "setting": setting, "seed": seed, "weights": WEIGHTS_FILE, "source": fingerprint})
    manifest.update({"description": setup.weights})
    specs = {v: parse_variant(v) for v in wanted}
    float_precisions = sorted({s["precision"] for s in specs.values() if s["precision"] != INT8} | {"fp32"})
    from edgecap.workshop.export import export_onnx

    t0 = time.perf_counter()
    with torch.no_grad():
        exported = export_onnx(setup.model, None, precisions=float_precisions, parity=False)
    log(f"   exported {model} {float_precisions} in {time.perf_counter() - t0:.0f} s")
    roles = exported.spec.runtime_graphs
    for variant, spec in specs.items():
        if spec["precision"] == INT8:
            from edgecap.workshop.export.calibration import quantize_int8

            t0 = time.perf_counter()
            cfg = setup.decode_cfg.replace(strategy="beam", beam_size=3, n_best=1, max_len=steps, min_len=steps - 1)
            # calibration feeds: the benchmark's input distribution, other draws than the timed batch
            feature_dim = random_models.SETTINGS[setting](model)["feature_dim"]
            feeds = [_numpy_inputs(random_models.grid_inputs(4, feature_dim, seed + 1 + i)) for i in range(4)]
            result = quantize_int8(
                exported.runtime_models("fp32"), exported.spec, feeds, cfg, preset=spec["preset"], progress=False
            )
            models = result.models
            record = {**spec, "resolved_preset": result.preset}
            log(f"   quantised {model} {variant} ({result.preset}) in {time.perf_counter() - t0:.0f} s")
        else:
            models = exported.runtime_models(spec["precision"])
            record = dict(spec)
        files = {}
        for role, graph in models.items():
            name = f"{variant.replace(':', '-')}/{roles[role]}.onnx"
            write_bytes(directory / name, graph.SerializeToString())
            files[role] = name
        manifest["variants"][variant] = {**record, "files": files}
        write_json(directory / MANIFEST, manifest)
    return manifest


# -- one cell, in a fresh process --------------------------------------------------------------------------------------
class _Capture:
    """Forwards a StepModel and keeps the (tokens, state) fed to step number ``at`` (0-based)."""

    def __init__(self, inner: Any, at: int) -> None:
        self.inner, self.at, self.calls = inner, at, 0
        self.captured: tuple[np.ndarray, Mapping[str, Any]] | None = None

    def encode(self, inputs: Mapping[str, Any]) -> Any:
        self.calls = 0
        return self.inner.encode(inputs)

    def step(self, tokens: np.ndarray, state: Any) -> Any:
        if self.calls == self.at:
            self.captured = (np.array(tokens, copy=True), dict(state))
        self.calls += 1
        return self.inner.step(tokens, state)

    def select(self, state: Any, index: np.ndarray) -> Any:
        return self.inner.select(state, index)


def _onnxruntime_options(threads: int, session_config: Mapping[str, str]) -> dict[str, Any]:
    """The settings ``Captioner.load()`` gives its sessions by default (``threads="auto"``) on a budget of ``threads``
    cores: one non-spinning intra-op thread, one inter-op thread, sequential; from 2 cores a batch decodes as
    ``threads`` concurrent chunks of images, and a *wide* session of ``threads`` non-spinning threads takes other
    large calls (``docs/cpu.md``). The ``--onnxruntime-config`` entries go on top (an
    explicit entry wins). JSON-ready: the wide plan is its dict (``_runtime_options`` turns it back)."""
    from edgecap.runtime.backends.threads import plan_threads

    plan = plan_threads("auto", cores=threads)
    options = plan.step_model_options()
    options["session_config"] = {**options["session_config"], **session_config}
    options["wide"] = plan.wide.as_dict() if plan.wide is not None else None
    return {"providers": "cpu", **options}


def _runtime_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`_onnxruntime_options` as ``OnnxRuntimeSession`` keyword arguments (the wide plan as a ``WidePlan``)."""
    from edgecap.runtime.backends.threads import WidePlan

    wide = options.get("wide")
    return {**options, "wide": WidePlan.from_dict(wide) if wide is not None else None}


@contextlib.contextmanager
def _step_model(
    column: str, setup: Any, directory: Path, manifest: Mapping[str, Any], options: Mapping[str, Any]
) -> Iterator[Any]:
    """The StepModel of ``column`` (ONNX Runtime sessions open for the block)."""
    from edgecap.workshop.torch_runtime.prefix import PrefixRerunStepModel
    from edgecap.workshop.torch_runtime.runtime import TorchStepModel

    if column == BASELINE:
        yield PrefixRerunStepModel(setup.model)
    elif column == TORCH:
        yield TorchStepModel(setup.model)
    elif column.startswith(ONNXRUNTIME_PREFIX):
        from edgecap.runtime.backends.onnxruntime.step import create_onnxruntime_step_model

        variant = column[len(ONNXRUNTIME_PREFIX) :]
        record = manifest["variants"].get(variant)
        if record is None:
            raise SystemExit(
                f"error: {directory / MANIFEST} has no variant {variant!r} (has {list(manifest['variants'])})"
            )
        files = record["files"]
        runtime_options = _runtime_options(options)
        encoder, step = directory / files["encoder"], directory / files["step"]
        with create_onnxruntime_step_model(encoder, step, **runtime_options) as sm:
            yield sm
    else:
        raise SystemExit(f"error: unknown column {column!r}")


def _cell_setup(spec: Mapping[str, Any]) -> tuple[Any, Any, Path, dict[str, Any]]:
    import torch
    from safetensors.torch import load_model

    from tools import random_models

    torch.set_num_threads(int(spec["threads"]))
    directory = Path(spec["dir"])
    manifest = read_manifest(directory)
    setup = random_models.random_setup(spec["model"], int(spec["batch"]), int(spec["seed"]), spec["setting"])
    load_model(setup.model, str(directory / manifest["weights"]))
    beam = int(spec["beam"])
    steps = int(spec["steps"])
    cfg = setup.decode_cfg.replace(
        strategy="beam" if beam > 1 else "greedy", beam_size=beam, n_best=1, max_len=steps, min_len=steps - 1
    )
    return setup, cfg, directory, manifest


def time_decodes(spec: Mapping[str, Any], decode_once: Any) -> dict[str, Any]:
    """``spec["warmup"]`` untimed then ``spec["repeats"]`` timed calls of ``decode_once()`` (-> each image's token
    ids); captions/s of the median, and a digest and the mean length of the decoded tokens. Every column's cell."""
    times, digest, lengths = [], None, [0]
    for i in range(int(spec["warmup"]) + int(spec["repeats"])):
        start = time.perf_counter()
        tokens = decode_once()
        elapsed = time.perf_counter() - start
        if i >= int(spec["warmup"]):
            times.append(elapsed)
            digest = digest or hashlib.sha1(json.dumps(tokens).encode()).hexdigest()[:12]
            lengths = [len(t) for t in tokens]
    median = statistics.median(times)
    return {
        "times_s": times,
        "median_s": median,
        "captions_per_s": int(spec["batch"]) / median,
        "tokens_sha1": digest,
        "mean_tokens": statistics.mean(lengths),
    }


def run_cell(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Warm-ups then timed decodes of one cell; captions/s of the median, and a digest of the decoded tokens."""
    import torch

    from edgecap.runtime.decoding import decode

    if spec["column"] == OFFICIAL:
        return run_official_cell(spec)
    setup, cfg, directory, manifest = _cell_setup(spec)
    inputs = setup.batches[0]
    options = _onnxruntime_options(int(spec["threads"]), spec.get("session_config", {}))
    with torch.inference_mode(), _step_model(spec["column"], setup, directory, manifest, options) as step_model:

        def decode_once() -> list[list[int]]:
            return [list(hyps[0].tokens) if hyps else [] for hyps in decode(step_model, inputs, cfg)]

        result = time_decodes(spec, decode_once)
    return {**result, **({"onnxruntime_options": options} if spec["column"].startswith(ONNXRUNTIME_PREFIX) else {})}


def run_official_cell(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The official code's cell: its model for the row's config (``build``, random init from the
    official code under ``--seed``) decoding the row's features (the same draw as the other columns') with its own
    decode function (beam 1 = its greedy path), timed like every other cell."""
    import torch

    from tools import random_models

    torch.set_num_threads(int(spec["threads"]))
    setup = random_models.random_setup(spec["model"], int(spec["batch"]), int(spec["seed"]), spec["setting"])
    inputs = setup.batches[0]
    kind, checkout = spec["official"]["kind"], Path(spec["official"]["path"])
    check_checkout(kind, checkout)
    settings = random_models.SETTINGS[spec["setting"]](spec["model"])
    steps, beam = int(spec["steps"]), int(spec["beam"])
    model = build_official(kind, checkout, spec["model"], settings, steps, int(spec["seed"]))
    with torch.no_grad():
        result = time_decodes(spec, official_decoder(kind, model, inputs, beam, steps))
    code = OFFICIAL_CODE[kind]
    return {**result, "official": {"repo": code.repo, "pinned_commit": code.commit, "function": code.function}}


def run_step_timing(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The step graph of one ONNX Runtime variant alone, on one thread at batch 1: the inputs of step ``steps // 2`` of
    a
    decode (greedy: 1 row; beam: ``beam`` rows), run ``iters`` times; median seconds per step; and the floor its
    weight matmuls put under it on these inputs (``tools.kernel_floor``)."""
    from edgecap.runtime.decoding import decode
    from tools.kernel_floor import kernel_floor

    out = {}
    for beam in spec["beams"]:
        setup, cfg, directory, manifest = _cell_setup({**spec, "beam": beam, "batch": 1})
        options = _onnxruntime_options(1, spec.get("session_config", {}))
        with _step_model(ONNXRUNTIME_PREFIX + spec["variant"], setup, directory, manifest, options) as step_model:
            capture = _Capture(step_model, int(spec["steps"]) // 2)
            decode(capture, setup.batches[0], cfg)
            tokens, state = capture.captured
            session = step_model.step_runtime.session
            dtypes = {i.name: i.type for i in session.get_inputs()}
            token_dtype = np.int32 if dtypes[step_model.tokens_name] == "tensor(int32)" else np.int64
            feed = {step_model.tokens_name: tokens.astype(token_dtype)}
            feed.update({name: np.asarray(state[name]) for name in step_model.state_names})
            for _ in range(10):
                session.run(None, feed)
            times = []
            deadline = time.perf_counter() + float(spec["seconds"])
            while len(times) < int(spec["iters"]) or time.perf_counter() < deadline:
                start = time.perf_counter()
                session.run(None, feed)
                times.append(time.perf_counter() - start)
                if len(times) >= 20 * int(spec["iters"]):
                    break
        floor = kernel_floor(directory / manifest["variants"][spec["variant"]]["files"]["step"], feed, runs=300)
        out[str(beam)] = {
            "rows": int(tokens.shape[0]),
            "median_s": statistics.median(times),
            "runs": len(times),
            "kernel_floor": floor,
        }
    return out


# -- the weight-read limit -------------------------------------------------------------------------------------------
#: Ops that only re-type or re-shape a weight on its way to the matmul reading it: a use of their output is a use of
#: the weight (a shared layer's QDQ weight has one DequantizeLinear feeding every position's MatMul).
WEIGHT_PASS_THROUGH = frozenset({"DequantizeLinear", "Cast", "Transpose", "Reshape", "Identity"})


def step_weight_bytes(path: Path) -> int:
    """Bytes of weights one step graph run reads: each initializer at its stored dtype, once per node that reads it.

    A weight shared by several nodes counts once per node (ACORT's decoder layer is shared by its two positions, so
    a step reads it twice: it does not stay in the 1 MB L2 between the positions). A use through a node that only
    re-types or re-shapes it (:data:`WEIGHT_PASS_THROUGH`, e.g. the DequantizeLinear of a QDQ weight) counts each
    use of that node's output. A table only indexed by ``Gather`` (token and position embeddings) is left out: a
    step reads one row of it per hypothesis, not the table; a table a matmul also reads (tied output weights)
    counts for that matmul."""
    import onnx
    from onnx import helper

    model = onnx.load(str(path))
    consumers: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def uses(name: str) -> int:
        count = 0
        for node in consumers.get(name, ()):
            if node.op_type == "Gather" and node.input[0] == name:
                continue
            if node.op_type in WEIGHT_PASS_THROUGH and node.input[0] == name:
                count += sum(uses(out) for out in node.output)
            else:
                count += 1
        return count

    total = 0
    for init in model.graph.initializer:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
        total += int(np.prod(init.dims, dtype=np.int64)) * itemsize * uses(init.name)
    return total


def l3_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The L3 size of CPU 0 from sysfs (``32768K`` -> bytes); None when unreadable."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        for index in sorted(root.glob("index*")):
            if (index / "level").read_text().strip() == "3":
                size = (index / "size").read_text().strip()
                return int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
    except (OSError, ValueError):
        return None
    return None


def read_rate(nbytes: int, repeats: int = 9) -> float:
    """Bytes/s a numpy dot product streams through two float32 buffers of ``nbytes`` in all (median of repeats)."""
    half = max(1, nbytes // 8)
    a, b = np.ones(half, np.float32), np.ones(half, np.float32)
    float(np.dot(a, b))  # touch the pages first
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        float(np.dot(a, b))
        times.append(time.perf_counter() - start)
    return 8 * half / statistics.median(times)


def memory_rates(l3: int | None) -> dict[str, Any]:
    """The read rate of a buffer half the L3 size (fits) and of one 8x the L3 (streams from DRAM)."""
    l3_size = l3 or 32 << 20
    return {
        "l3_bytes": l3,
        "l3_fit_buffer_bytes": l3_size // 2,
        "l3_GBps": read_rate(l3_size // 2, repeats=31) / 1e9,
        "dram_buffer_bytes": 8 * l3_size,
        "dram_GBps": read_rate(8 * l3_size) / 1e9,
    }


def weight_limit(weight_bytes: int, rates: Mapping[str, Any]) -> dict[str, Any]:
    """The per-step time of reading the weights once: at the L3 rate when they fit the L3, else the DRAM rate."""
    fits = rates["l3_bytes"] is not None and weight_bytes <= rates["l3_bytes"]
    rate = rates["l3_GBps"] if fits else rates["dram_GBps"]
    return {"weight_bytes": weight_bytes, "fits_l3": fits, "rate_GBps": rate, "limit_s": weight_bytes / (rate * 1e9)}


# -- driving the cells -------------------------------------------------------------------------------------------------
def _run_child(payload: Mapping[str, Any], flag: str, timeout: float) -> dict[str, Any]:
    """Run this script with ``flag JSON`` in a fresh process; its last stdout line is the JSON result."""
    from tools.stages import child_env

    cmd = [sys.executable, "-m", "research.side_by_side", flag, json.dumps(payload)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env(), check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {done.returncode}: " + " | ".join(tail)}
    return json.loads(done.stdout.strip().splitlines()[-1])


def aggregate(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A cell's round results -> the median of round medians (captions/s), its min–max spread, the token digests."""
    good = [s for s in samples if "error" not in s]
    if not good:
        return {"captions_per_s": None, "errors": [s["error"] for s in samples]}
    values = [s["captions_per_s"] for s in good]
    median = statistics.median(values)
    return {
        "captions_per_s": median,
        "min": min(values),
        "max": max(values),
        "spread": (max(values) - min(values)) / median,
        "rounds": values,
        "tokens_sha1": sorted({s["tokens_sha1"] for s in good}),
        "errors": [s["error"] for s in samples if "error" in s],
        **({"onnxruntime_options": good[0]["onnxruntime_options"]} if "onnxruntime_options" in good[0] else {}),
    }


def _fmt(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def ratio_column(columns: Sequence[str]) -> str:
    """The column the table's ratios divide by: the official code when it ran, else the re-run-prefix stand-in."""
    return OFFICIAL if OFFICIAL in columns else BASELINE


def markdown(report: Mapping[str, Any]) -> str:
    """The side-by-side table (captions/s, ratio to the official code's column, or to the stand-in when the official
    code did not run) and the weight-read limit table."""
    columns = report["columns"]
    head = [COLUMN_LABELS.get(c, f"edgecap ONNX Runtime {c[len(ONNXRUNTIME_PREFIX) :]}") for c in columns]
    lines = []
    if report["rows"]:
        lines += _table_lines(report, head)
    limit = report.get("limit")
    if limit:
        lines += _limit_lines(limit)
    return "\n".join(lines).strip("\n") + "\n"


def _table_lines(report: Mapping[str, Any], head: Sequence[str]) -> list[str]:
    columns = report["columns"]
    lines = [
        "| model, strategy | batch | threads | " + " | ".join(head) + " |",
        "|---|---:|---:|" + "---:|" * len(columns),
    ]
    base_column = ratio_column(columns)
    for row in report["rows"]:
        cells = row["cells"]
        base = cells.get(base_column, {}).get("captions_per_s")
        out = []
        for column in columns:
            value = cells.get(column, {}).get("captions_per_s")
            text = _fmt(value)
            if value is not None and base and column != base_column:
                text += f" ({value / base:.1f}×)"
            out.append(text)
        lines.append(f"| {row['label']} | {row['batch']} | {row['threads']} | " + " | ".join(out) + " |")
    spreads = [c["spread"] for r in report["rows"] for c in r["cells"].values() if c.get("spread") is not None]
    lines.append("")
    lines.append(
        f"captions/s, median of {report['rounds']} round(s) of a fresh process per cell ({report['warmup']} warm-ups, "
        f"median of {report['repeats']} timed decodes); ratios vs the "
        + ("official code." if base_column == OFFICIAL else "re-run-prefix stand-in (the official code did not run).")
    )
    lines += [f"Official code: {note}" for note in report.get("official_notes", [])]
    if spreads and report["rounds"] > 1:
        lines.append(
            "Spread (max − min of a cell's round medians, over its median): "
            f"median {100 * statistics.median(spreads):.0f} %, largest {100 * max(spreads):.0f} %."
        )
    mismatched = [
        r["label"] + f", batch {r['batch']}, threads {r['threads']}" for r in report["rows"] if not r["same_tokens"]
    ]
    lines.append(
        "Tokens: every edgecap FP32 column decoded the stand-in's tokens."
        if not mismatched
        else f"Tokens differ between FP32 columns in: {'; '.join(mismatched)}."
    )
    return lines


def _limit_lines(limit: Mapping[str, Any]) -> list[str]:
    rates = limit["memory"]
    l3 = rates["l3_bytes"]
    lines = [
        "",
        f"Weight-read limit: read rate {rates['l3_GBps']:.1f} GB/s in the L3 "
        f"({'%.0f MB' % (l3 / 2**20) if l3 else 'size unknown'}), {rates['dram_GBps']:.1f} GB/s from DRAM; "
        "step weights = the bytes of initializers the step graph reads, once per node reading them (a shared layer "
        "counts once per position; embedding tables a Gather indexes left out); "
        "step graph alone on ONNX Runtime, 1 thread, batch 1, mid-caption inputs; weight matmuls = the step's "
        "matmuls with a weight, as ONNX Runtime runs them, together in one graph with nothing else on the same inputs "
        "(`tools.kernel_floor`): no layout of the rest of the step goes below it on these kernels.",
        "",
        "| model | variant | step weights MB | fits L3 | limit µs | step µs (rows) | step / limit "
        "| weight matmuls µs | matmuls / limit |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for item in limit["steps"]:
        if "error" in item:
            lines.append(f"| {item['model']} | {item['variant']} | | | | {item['error']} | | | |")
            continue
        lim = item["limit"]
        for timing in item["timing"].values():
            floor = timing.get("kernel_floor")
            floor_cells = (
                f"{1e6 * floor['floor_s']:.0f} | {floor['floor_s'] / lim['limit_s']:.1f}×" if floor else "– | –"
            )
            lines.append(
                f"| {item['model']} | {item['variant']} | {lim['weight_bytes'] / 1e6:.2f} "
                f"| {'yes' if lim['fits_l3'] else 'no'} | {1e6 * lim['limit_s']:.0f} "
                f"| {1e6 * timing['median_s']:.0f} ({timing['rows']}) "
                f"| {timing['median_s'] / lim['limit_s']:.1f}× | {floor_cells} |"
            )
    return lines


def _same_tokens(cells: Mapping[str, Mapping[str, Any]], manifest: Mapping[str, Any]) -> bool:
    """Whether the re-run-prefix stand-in, torch and every FP32 ONNX Runtime column decoded the same tokens in every
    round
    (the official code's column has its own weights: not compared)."""
    fp32 = [
        c
        for c in cells
        if c != OFFICIAL
        and (
            not c.startswith(ONNXRUNTIME_PREFIX)
            or manifest["variants"].get(c[len(ONNXRUNTIME_PREFIX) :], {}).get("precision") == "fp32"
        )
    ]
    digests = {d for c in fp32 for d in cells[c].get("tokens_sha1", [])}
    return len(digests) <= 1


def check_args(args: SimpleNamespace) -> SimpleNamespace:
    """The options the click types cannot check on their own."""
    if args.quick:
        args.model = args.model or [(QUICK_MODEL, QUICK_STEPS)]
        args.rounds, args.warmup, args.repeats = 1, 1, 2
    if args.limit_only and args.no_limit:
        raise click.UsageError("--limit-only and --no-limit exclude each other")
    if args.rounds < 1 or args.repeats < 1 or args.warmup < 0:
        raise click.UsageError("--rounds and --repeats must be >= 1, --warmup >= 0")
    for flag in ("threads", "batch", "beam"):
        bad = [v for v in getattr(args, flag) or [] if v < 1]
        if bad:
            raise click.UsageError(f"--{flag} must be >= 1, got {bad[0]}")
    try:
        args.variant_list = [v for v in args.variants.split(",") if v]
        for variant in args.variant_list:
            if variant != EXPORTED:
                parse_variant(variant)
        args.session_config = dict(_key_value(item) for item in args.ort_config or [])
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    return args


def _key_value(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ValueError(f"--onnxruntime-config {item!r}: expected KEY=VALUE")
    return key, value


def _environment() -> dict[str, Any]:
    import onnxruntime

    from tools import random_models

    return {**random_models.torch_environment(), "onnxruntime": onnxruntime.__version__}


def _child_main(flag: str, payload: str) -> int:
    spec = json.loads(payload)
    result = run_cell(spec) if flag == "cell" else run_step_timing(spec)
    print(json.dumps(result))
    return 0


def execute(args: SimpleNamespace) -> int:
    if args.cell:
        return _child_main("cell", args.cell)
    if args.step_timing:
        return _child_main("step", args.step_timing)
    from tools.files import write_json, write_text

    models = args.model or [(name, steps) for name, steps in FORCED_STEPS.items()]
    try:
        rows = plan_rows(
            models, full=args.full, quick=args.quick, threads=args.threads, batch=args.batch, beam=args.beam
        )
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from exc
    command = shlex.join(["python", "research/side_by_side.py", *sys.argv[1:]])
    print(f"== export into {args.work}", flush=True)
    manifests = {}
    for name, steps in models:
        wanted = [v for v in args.variant_list if v != EXPORTED]
        manifests[name] = prepare_model(args.work, name, steps, wanted, args.seed, args.setting)
    variants = ort_variants(args.variant_list, manifests)
    official, notes = official_checkouts(args, models)
    for note in notes:
        print(f"   official code: {note}", flush=True)
    columns = columns_for(variants, baseline=not args.no_baseline, official=bool(official))
    report: dict[str, Any] = {
        "command": command,
        "environment": _environment(),
        "setting": args.setting,
        "seed": args.seed,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "columns": columns,
        "column_labels": {
            c: COLUMN_LABELS.get(c, f"edgecap ONNX Runtime {c[len(ONNXRUNTIME_PREFIX) :]}") for c in columns
        },
        "session_config": args.session_config,
        "onnxruntime_options": {
            str(t): _onnxruntime_options(t, args.session_config) for t in sorted({r.threads for r in rows})
        },
        "variants": {name: m["variants"] for name, m in manifests.items()},
        "official": official,
        "official_notes": notes,
    }
    samples: dict[tuple[Row, str], list[dict[str, Any]]] = {}
    for r in range(0 if args.limit_only else args.rounds):
        cells = round_cells(rows, columns, r)
        print(f"== round {r + 1}/{args.rounds}: {len(cells)} cells", flush=True)
        for row, column in cells:
            if (
                column.startswith(ONNXRUNTIME_PREFIX)
                and column[len(ONNXRUNTIME_PREFIX) :] not in manifests[row.model]["variants"]
            ):
                samples.setdefault((row, column), [])  # "exported" listed a variant this model does not have
                continue
            if column == OFFICIAL and row.model not in official:
                samples.setdefault((row, column), [])  # no checkout of this model's official code
                continue
            payload = {
                **asdict(row), "column": column, "dir": str(model_dir(args.work, row.model, args.setting, args.seed)),
                "seed": args.seed, "setting": args.setting, "warmup": args.warmup, "repeats": args.repeats,
                "session_config": args.session_config,
                **({"official": official[row.model]} if column == OFFICIAL else {}),
            }  # fmt: skip
            result = _run_child(payload, "--cell", args.cell_timeout)
            samples.setdefault((row, column), []).append(result)
            shown = result.get("error") or f"{result['captions_per_s']:.2f} captions/s"
            print(f"   {row.label}, batch {row.batch}, threads {row.threads}, {column}: {shown}", flush=True)
    report["rows"] = []
    for row in [] if args.limit_only else rows:
        cells = {column: aggregate(samples[(row, column)]) for column in columns}
        report["rows"].append(
            {
                **asdict(row),
                "label": row.label,
                "cells": cells,
                "same_tokens": _same_tokens(cells, manifests[row.model]),
            }
        )
    if not args.no_limit:
        report["limit"] = measure_limits(args, models, manifests, rows, variants)
    report["environment"]["loadavg_after"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "side_by_side.json", report)
    text = markdown(report)
    write_text(args.out / "side_by_side.md", f"`{command}`\n\n{text}")
    print(text)
    print(f"wrote {args.out / 'side_by_side.json'} and {args.out / 'side_by_side.md'}", file=sys.stderr)
    failed = [c for r in report["rows"] for c in r["cells"].values() if c["errors"]]
    return 1 if failed else 0


@click.command(help=__doc__.split("\n\n")[0])
@click.option(
    "--model",
    type=parse_model,
    multiple=True,
    help=f"NAME or NAME:STEPS (repeatable; default {', '.join(f'{k}:{v}' for k, v in FORCED_STEPS.items())})",
)
@click.option(
    "--variants",
    default=",".join(DEFAULT_VARIANTS),
    help="ONNX Runtime columns, comma-separated: fp32, fp16, int8 (= int8:cpu-auto), int8:PRESET,\n"
    "exported (every variant already in --work) (default %(default)s)",
    show_default=True,
)
@click.option("--threads", type=int, multiple=True, help="threads per cell (repeatable; replaces the grid's)")
@click.option("--batch", type=int, multiple=True, help="images per decode (repeatable; replaces the grid's)")
@click.option("--beam", type=int, multiple=True, help="beam size, 1 = greedy (repeatable; replaces the grid's)")
@click.option("--full", is_flag=True, help="every model at threads 1,2 x batch 1,16 x greedy, beam 3")
@click.option("--rounds", type=int, default=3, help="rounds of every cell, interleaved (default 3)", show_default=True)
@click.option("--warmup", type=int, default=2, help="untimed decodes per cell (2)", show_default=True)
@click.option("--repeats", type=int, default=7, help="timed decodes per cell, median (7)", show_default=True)
@click.option(
    "--setting",
    type=click.Choice(("paper", "edge")),
    default="paper",
    help="model settings (default paper)",
    show_default=True,
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--no-baseline", is_flag=True, help="skip the re-run-prefix stand-in column")
@click.option(
    "--official-acort",
    type=click.Path(path_type=Path),
    metavar="PATH",
    help="checkout of jiahuei/sparse-image-captioning: time the official ACORT code\n"
    "(ort-family rows; commit pinned in OFFICIAL_CODE)",
)
@click.option(
    "--official-expansionnet",
    type=click.Path(path_type=Path),
    metavar="PATH",
    help="checkout of jchenghu/ExpansionNet_v2: time the official ExpansionNet v2 code",
)
@click.option("--no-limit", is_flag=True, help="skip the weight-read limit")
@click.option("--limit-only", is_flag=True, help="only the weight-read limit (no side-by-side cells)")
@click.option(
    "--onnxruntime-config",
    multiple=True,
    default=[],
    metavar="KEY=VALUE",
    help="ONNX Runtime session config entry for every ONNX Runtime cell,\n"
    "e.g. session.intra_op.allow_spinning=0 (repeatable)",
    show_default=True,
)
@click.option(
    "--cell-timeout", type=float, default=1200.0, help="seconds before a cell process is stopped", show_default=True
)
@click.option("--quick", is_flag=True, help=f"smoke run: {QUICK_MODEL}, {QUICK_STEPS} steps, 1 round")
@click.option(
    "--work",
    type=click.Path(path_type=Path),
    default=Path("side_by_side_work"),
    help="export cache folder",
    show_default=True,
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("side_by_side_out"),
    help="where the JSON and markdown go",
    show_default=True,
)
@click.option("--cell", hidden=True)
@click.option("--step-timing", hidden=True)
def main(**options: Any) -> None:
    # repeatable options come as tuples: a list, or None when not given (execute sets the defaults)
    args = SimpleNamespace(**{k: list(v) or None if isinstance(v, tuple) else v for k, v in options.items()})
    sys.exit(execute(check_args(args)))


def official_checkouts(
    args: SimpleNamespace, models: Sequence[tuple[str, int]]
) -> tuple[dict[str, dict[str, str]], list[str]]:
    """Model -> ``{"kind", "path"}`` of the official code that decodes it (from ``--official-acort`` /
    ``--official-expansionnet``; each checked for the files a cell imports), and a note per model left out."""

    paths = {ACORT: args.official_acort, EXPANSIONNET: args.official_expansionnet}
    found, notes = {}, []
    for name, _ in models:
        kind = official_kind(name)
        if kind is None:
            notes.append(f"{name}: no official code known; not run.")
            continue
        code = OFFICIAL_CODE[kind]
        if paths[kind] is None:
            notes.append(f"{name}: not run (no {code.flag} PATH, a checkout of {code.repo} at {code.commit[:12]}).")
            continue
        try:
            check_checkout(kind, paths[kind])
        except ValueError as exc:
            raise SystemExit(f"error: {exc}") from exc
        found[name] = {"kind": kind, "path": str(Path(paths[kind]).resolve())}
        notes.append(f"{name}: {code.repo} (pinned {code.commit[:12]}), {code.function}.")
    return found, notes


def measure_limits(
    args: SimpleNamespace,
    models: Sequence[tuple[str, int]],
    manifests: Mapping[str, Any],
    rows: Sequence[Row],
    variants: Sequence[str],
) -> dict[str, Any]:
    """The machine's read rates, then per model and ONNX Runtime variant the weight bytes, the limit and the step
    time."""
    print("== weight-read limit", flush=True)
    rates = memory_rates(l3_bytes())
    steps = []
    for name, forced in models:
        directory = model_dir(args.work, name, args.setting, args.seed)
        beams = sorted({row.beam for row in rows if row.model == name})
        for variant in (v for v in variants if v in manifests[name]["variants"]):
            record = manifests[name]["variants"][variant]
            limit = weight_limit(step_weight_bytes(directory / record["files"]["step"]), rates)
            payload = {
                "model": name, "steps": forced, "threads": 1, "dir": str(directory), "seed": args.seed,
                "setting": args.setting, "variant": variant, "beams": beams, "iters": 5 if args.quick else 200,
                "seconds": 0.0 if args.quick else 2.0, "session_config": args.session_config,
            }  # fmt: skip
            timing = _run_child(payload, "--step-timing", args.cell_timeout)
            item = {"model": name, "variant": variant, "limit": limit}
            if "error" in timing:
                item["error"] = timing["error"]
            else:
                item["timing"] = timing
                for t in timing.values():
                    t["ratio_to_limit"] = t["median_s"] / limit["limit_s"]
                    t["kernel_floor"]["ratio_to_limit"] = t["kernel_floor"]["floor_s"] / limit["limit_s"]
            steps.append(item)
            print(f"   {name} {variant}: {json.dumps(item)}", flush=True)
    return {"memory": rates, "steps": steps}


# -- the official code -------------------------------------------------------------------------------------------------
# The official ACORT and ExpansionNet v2 code as a column of this script: built and decoded from a checkout.
#
# Nothing of the official repositories is in edgecap: the user passes a checkout (``--official-acort PATH``,
# ``--official-expansionnet PATH``) at the commit in :data:`OFFICIAL_CODE`, and a cell process imports the official
# *model modules* from it (only those: not the training, data or evaluation code, so the official requirements beyond
# torch and numpy are not needed), builds the official model with the row's architecture (edgecap's config of the same
# model: for ``acort-xsmall`` the paper's d=256, d_ff=1024, 8 heads, 2 layers sharing one, Share-KV) at the paper
# settings with the official random initialisation (seeded), and times the official decode function with its own beam
# search, on the same features as the edgecap columns of the row:
#
# - ACORT (``jiahuei/sparse-image-captioning``): ``RelationTransformerModel(config)(att_feats=, boxes=, att_masks=,
#   opt={"beam_size": K}, mode="sample")``, i.e. ``CachedTransformerBase._generate_captions`` and
#   ``CaptionModel.batch_beam_search`` with the official incremental key/value cache.
# - ExpansionNet v2 (``jchenghu/ExpansionNet_v2``): ``ExpansionNet_v2(...)(enc_x=, enc_x_num_pads=, mode="beam_search",
#   beam_size=K, beam_max_seq_len=steps + 1, ...)``, i.e. ``CaptioningModel.beam_search``: no cache, the whole prefix
#   re-run every step.
#
# Forced length, as for the edgecap columns: the end token given to the official code is an id the model cannot emit
# (the vocabulary size for ACORT, -1 for ExpansionNet v2), so no hypothesis ends early and every decode runs the
# protocol's steps (ACORT: ``max_seq_length = steps`` radix tokens; ExpansionNet v2: ``beam_max_seq_len = steps + 1``,
# the start token counted). The official weights are the official random initialisation, not edgecap's: the column's
# tokens are not compared with the others'.
ACORT = "acort"
EXPANSIONNET = "expansionnet"


@dataclass(frozen=True)
class OfficialCode:
    """One official repository: where it is, the commit the docs measured, the files a cell imports, and the decode
    function it times."""

    kind: str
    repo: str
    commit: str
    flag: str
    files: tuple[str, ...]
    function: str


OFFICIAL_CODE = {
    ACORT: OfficialCode(
        ACORT,
        "jiahuei/sparse-image-captioning",
        "0429b4f8a1e33263205ebfa76716ea6be6d5cdff",
        "--official-acort",
        (
            "sparse_caption/models/relation_transformer.py",
            "sparse_caption/models/transformer.py",
            "sparse_caption/models/caption_model.py",
            "sparse_caption/utils/model_utils.py",
            "sparse_caption/utils/misc.py",
        ),
        "RelationTransformerModel(...)(..., mode='sample') → CaptionModel.batch_beam_search, incremental cache",
    ),
    EXPANSIONNET: OfficialCode(
        EXPANSIONNET,
        "jchenghu/ExpansionNet_v2",
        "eb7f1c98d00cdaa61b60c43852155b3742fe5b45",
        "--official-expansionnet",
        ("models/ExpansionNet_v2.py", "models/captioning_model.py", "models/layers.py", "utils/masking.py"),
        "ExpansionNet_v2(...)(..., mode='beam_search') → CaptioningModel.beam_search, prefix re-run every step",
    ),
}

#: Families of edgecap model configs -> the official code that implements them.
FAMILY_KIND = {"ort": ACORT, "expansionnet": EXPANSIONNET}


def official_kind(model: str) -> str | None:
    """Which official code decodes ``model`` (an edgecap model name), or None."""
    from edgecap.workshop.models import get_model_cfg

    return FAMILY_KIND.get(get_model_cfg(model).family)


def check_checkout(kind: str, path: Path) -> None:
    """Raise ``ValueError`` naming what is missing when ``path`` is not a checkout of the official ``kind`` code."""
    code = OFFICIAL_CODE[kind]
    missing = [f for f in code.files if not (Path(path) / f).is_file()]
    if missing:
        raise ValueError(
            f"{code.flag} {path}: not a checkout of {code.repo} (missing {', '.join(missing)}); "
            f"clone it and check out {code.commit[:12]}"
        )


# -- importing the official model modules, and nothing else ------------------------------------------------------------
#: Top-level module names this helper registered, per checkout (so a later import of another checkout replaces them).
_LOADED: dict[str, str] = {}


def _forget(prefixes: tuple[str, ...]) -> None:
    for name in [n for n in sys.modules if n.split(".")[0] in prefixes]:
        if _LOADED.get(name.split(".")[0]) is None:
            raise RuntimeError(
                f"a module {name!r} not from an official checkout is imported; the official code needs that name"
            )
        del sys.modules[name]


def _package(name: str, directory: Path, **attrs: Any) -> types.ModuleType:
    """An empty package ``name`` whose submodules load from ``directory``: the official ``__init__`` (which imports
    every model, data and training module of the repository) does not run."""
    module = types.ModuleType(name)
    module.__path__ = [str(directory)]
    module.__dict__.update(attrs)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    return module


class _DataPipelineOnly:
    """Stands for the official collate classes: a model class names one for its argument parser, decoding never
    uses it (the real module imports the tokenizer, torchvision and PIL)."""


def import_acort(checkout: Path) -> types.ModuleType:
    """``sparse_caption.models.relation_transformer`` of the checkout, with the model modules it imports
    (``transformer``, ``caption_model``, ``utils.model_utils``, ``utils.misc``) and nothing of the data pipeline."""
    root = Path(checkout) / "sparse_caption"
    _forget(("sparse_caption",))
    _package("sparse_caption", root)
    _package("sparse_caption.models", root / "models", register_model=lambda name: lambda cls: cls)
    _package("sparse_caption.utils", root / "utils")
    _package("sparse_caption.data", root / "data")
    collate = types.ModuleType("sparse_caption.data.collate")
    collate.ObjectRelationCollate = collate.UpDownCollate = _DataPipelineOnly
    sys.modules[collate.__name__] = collate
    _LOADED["sparse_caption"] = str(checkout)
    return importlib.import_module("sparse_caption.models.relation_transformer")


def import_expansionnet(checkout: Path) -> types.ModuleType:
    """``models.ExpansionNet_v2`` of the checkout (it imports ``models.layers``, ``models.captioning_model`` and
    ``utils.masking`` by these top-level names)."""
    root = Path(checkout)
    _forget(("models", "utils"))
    _package("models", root / "models")
    _package("utils", root / "utils")
    _LOADED["models"] = _LOADED["utils"] = str(checkout)
    return importlib.import_module("models.ExpansionNet_v2")


# -- building and decoding -----------------------------------------------------------------------------------------
def build_official(kind: str, checkout: Path, model: str, settings: Mapping[str, int], steps: int, seed: int) -> Any:
    """The official model for edgecap's ``model`` config at ``settings`` (vocabulary size, feature dim), randomly
    initialised by the official code under ``torch.manual_seed(seed)``, in eval mode."""
    import torch

    from edgecap.workshop.models import get_model_cfg

    cfg = get_model_cfg(model)
    torch.manual_seed(seed)
    if kind == ACORT:
        module = import_acort(checkout)
        layers = len(cfg.enc_layer_map)
        if len(cfg.dec_layer_map) != layers:
            raise ValueError(f"{model}: the official code takes one layer count for both sides")
        config = types.SimpleNamespace(
            d_model=cfg.d_model,
            dim_feedforward=cfg.d_ff,
            num_layers=layers,
            num_heads=cfg.heads,
            share_att_encoder=cfg.share_att,
            share_att_decoder=cfg.share_att,
            share_layer_encoder=tuple(cfg.enc_layer_map),
            share_layer_decoder=tuple(cfg.dec_layer_map),
            drop_prob_src=cfg.feature_dropout,
            max_seq_length=steps,
            att_feat_size=settings["feature_dim"],
            vocab_size=settings["vocab_size"],
            bos_token_id=settings["vocab_size"] - 2,
            eos_token_id=settings["vocab_size"],  # never emitted: every decode runs max_seq_length steps
            unk_token_id=None,
            pad_token_id=0,
            no_box_trigonometric_embedding=not cfg.geometry,
        )
        return module.RelationTransformerModel(config).eval()
    if kind == EXPANSIONNET:
        module = import_expansionnet(checkout)
        vocab = settings["vocab_size"]
        words = [f"w{i}" for i in range(vocab)]
        drops = types.SimpleNamespace(enc=0.0, dec=0.0, enc_input=0.0, dec_input=0.0, other=0.0)
        return module.ExpansionNet_v2(
            d_model=cfg.d_model,
            N_enc=cfg.enc_layers,
            N_dec=cfg.dec_layers,
            ff=cfg.d_ff,
            num_heads=cfg.heads,
            num_exp_enc_list=list(cfg.enc_groups),
            num_exp_dec=cfg.dec_slots,
            output_word2idx={w: i for i, w in enumerate(words)},
            output_idx2word=words,
            max_seq_len=cfg.max_len,
            drop_args=drops,
            img_feature_dim=settings["feature_dim"],
            rank="cpu",
        ).eval()
    raise ValueError(f"unknown official code {kind!r}")


def official_decoder(
    kind: str, model: Any, inputs: Mapping[str, Any], beam: int, steps: int
) -> Callable[[], list[list[int]]]:
    """A call of the official decode function on ``inputs`` (edgecap's features, boxes, mask) at ``beam`` (1 =
    the official greedy path), returning each image's best tokens."""
    feats, boxes, mask = inputs["features"], inputs["boxes"], inputs["feature_mask"]
    if kind == ACORT:
        opt = {"beam_size": beam}

        def run() -> list[list[int]]:
            seq, _ = model(att_feats=feats, boxes=boxes, att_masks=mask.float(), opt=opt, mode="sample")
            return [row[0].tolist() for row in seq]

        return run
    if kind == EXPANSIONNET:
        kwargs = {
            "beam_size": beam,
            "beam_max_seq_len": steps + 1,
            "how_many_outputs": 1,
            "sample_or_max": "max",
            "sos_idx": 0,
            "eos_idx": -1,  # never emitted: every decode runs beam_max_seq_len - 1 words
        }
        pads = [0] * feats.shape[0]

        def run() -> list[list[int]]:
            pred, _ = model(enc_x=feats, enc_x_num_pads=pads, mode="beam_search", **kwargs)
            return [hyps[0][1:] for hyps in pred]

        return run
    raise ValueError(f"unknown official code {kind!r}")


if __name__ == "__main__":
    main()
