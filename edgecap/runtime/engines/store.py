"""Where engines live in a bundle, what they are keyed by, and when one may be loaded.

A TensorRT plan runs only on the TensorRT version and GPU architecture that built it, so engines are a per-machine
artefact derived from a bundle, stored beside its graphs::

    BUNDLE/engines/<precision>-b<max batch>-k<beam>-<key hash>/
        engine.json      the key, per role the graph it was built from (path + SHA-256), the plan's SHA-256,
                         the optimisation profile, the build settings
        encoder.plan + step.plan (or + refine.plan), reorder.plan + expand.plan (beam reordering on the device)
        timing.cache     TensorRT's timing cache, reused by the next build with this key

The key hashes the TensorRT version, the GPU name and compute capability, the precision, every profile's shapes and
every graph's SHA-256. The ``engines/`` folder is outside the bundle manifest's checksums (it is built after export,
on the target); each plan is checked against its own recorded SHA-256 before TensorRT deserialises it, and an engine
whose recorded TensorRT version, GPU or graph checksum differs from this machine and bundle is never loaded: the
runtime refuses naming the difference, ``edgecap engine`` builds a fresh one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgecap.runtime.bundle.limits import MAX_BEAM, MAX_DIM
from edgecap.runtime.bundle.manifest import DERIVED_DIRS, BundleError, bundle_file, sha256_file

__all__ = [
    "ENGINES_DIR",
    "RECORD_NAME",
    "EngineEnv",
    "EngineMismatchError",
    "EngineRecordError",
    "check_record",
    "engine_file",
    "engine_folders",
    "engine_key",
    "find_engines",
    "fitting_engines",
    "read_record",
    "verify_plans",
]

ENGINES_DIR = DERIVED_DIRS[0]
RECORD_NAME = "engine.json"
RECORD_FORMAT = "edgecap-engines"
RECORD_VERSION = 1


class EngineMismatchError(RuntimeError):
    """No engine of the bundle fits this machine and bundle; the message names what differs and what to run."""


class EngineRecordError(ValueError):
    """An engine folder whose ``engine.json`` or plan files are missing, malformed or modified."""


@dataclass(frozen=True)
class EngineEnv:
    """What an engine depends on besides the graph: the TensorRT version and the GPU."""

    trt_version: str
    gpu_name: str
    compute_capability: str

    def describe(self) -> str:
        return f"TensorRT {self.trt_version} on {self.gpu_name} (compute capability {self.compute_capability})"


def engine_key(
    env: EngineEnv,
    precision: str,
    profile_digests: Mapping[str, str],
    graph_sha256: Mapping[str, str],
    max_batch: int,
    beam: int,
) -> str:
    """The folder name of an engine set: readable precision and batch shape, then 16 hex digits of the hash of
    everything the plans depend on (a change in any of them gives a new key)."""
    payload = {
        "trt": env.trt_version,
        "gpu": env.gpu_name,
        "cc": env.compute_capability,
        "precision": precision,
        "profiles": dict(sorted(profile_digests.items())),
        "graphs": dict(sorted(graph_sha256.items())),
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return f"{precision}-b{max_batch}-k{beam}-{digest[:16]}"


def engine_file(folder: Path, name: Any, what: str) -> Path:
    """``folder / name`` for a file an engine set names (``what`` says which, for errors), under the bundle's one
    path rule (:func:`~edgecap.runtime.bundle.manifest.bundle_file`): a relative path that stays inside the engine
    folder once
    symlinks are resolved; and, for a bundle's engine set (``BUNDLE/engines/NAME``), inside the bundle too (the
    folder itself may be a symlink leaving it).

    Raises:
        EngineRecordError: the name breaks the rule.
    """
    folder = Path(folder)
    try:
        path = bundle_file(folder, name, f"{folder}: {what}", inside="the engine folder")
        if folder.parent.name == ENGINES_DIR:
            bundle_file(folder.parent.parent, f"{ENGINES_DIR}/{folder.name}/{name}", f"{folder}: {what}")
    except BundleError as exc:
        raise EngineRecordError(str(exc)) from None
    return path


#: The fields every record has, with their JSON types.
_RECORD_FIELDS: dict[str, type] = {"precision": str, "env": dict, "engines": dict}


def read_record(folder: Path) -> dict[str, Any]:
    """The parsed ``engine.json`` of an engine folder.

    Raises:
        EngineRecordError: missing, not JSON, or without the fields (of the types) a loader reads; the message names
            the file and the problem.
    """
    path = engine_file(folder, RECORD_NAME, RECORD_NAME)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EngineRecordError(f"{folder}: no {RECORD_NAME} (an interrupted or foreign engine folder)") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # JSON errors, a too-long number: ValueErrors
        raise EngineRecordError(f"{path}: unreadable ({exc})") from None
    except RecursionError:
        raise EngineRecordError(f"{path}: unreadable (its JSON nests too deeply)") from None
    if not isinstance(record, dict):
        raise EngineRecordError(f"{path}: not an edgecap engine record (a JSON {type(record).__name__}, not an object)")
    if record.get("format") != RECORD_FORMAT:
        raise EngineRecordError(f"{path}: not an edgecap engine record (format {record.get('format')!r})")
    version = record.get("format_version", 0)
    if isinstance(version, bool) or not isinstance(version, int):
        raise EngineRecordError(f"{path}: format_version {version!r} is not an integer")
    if version > RECORD_VERSION:
        raise EngineRecordError(f"{path}: written by a newer edgecap (format version {version})")
    for field, kind in _RECORD_FIELDS.items():
        if field not in record:
            raise EngineRecordError(f"{path}: lacks {field!r}")
        if not isinstance(record[field], kind):
            raise EngineRecordError(f"{path}: {field!r} is a {type(record[field]).__name__}, not a {kind.__name__}")
    for field in ("gathers", "request"):
        if not isinstance(record.get(field, {}), dict):
            raise EngineRecordError(f"{path}: {field!r} is a {type(record[field]).__name__}, not an object")
    for group in ("engines", "gathers"):
        for role, entry in record.get(group, {}).items():
            if not isinstance(entry, dict) or not isinstance(entry.get("plan"), str):
                raise EngineRecordError(f"{path}: {group}[{role!r}] is not an object with a 'plan' file name")
    for field, top in (("max_batch", MAX_DIM), ("beam", MAX_BEAM)):
        value = record.get("request", {}).get(field, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise EngineRecordError(f"{path}: request.{field} {value!r} is not a positive integer")
        if value > top:
            raise EngineRecordError(f"{path}: request.{field} is {value}, above the limit {top}")
    for role, entry in record["engines"].items():  # buffers are sized by the profile's largest dimensions
        _check_profile_dims(entry.get("profile"), f"{path}: engines[{role!r}].profile.dims")
    return record


def _check_profile_dims(profile: Any, where: str) -> None:
    dims = profile.get("dims", {}) if isinstance(profile, dict) else {}
    if not isinstance(dims, dict):
        raise EngineRecordError(f"{where} is not an object")
    for name, sizes in dims.items():
        if (
            not isinstance(sizes, list)
            or len(sizes) != 3
            or any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_DIM for v in sizes)
            or sorted(sizes) != sizes
        ):
            raise EngineRecordError(f"{where}[{name!r}] {sizes!r} is not (min, opt, max) integers in 0..{MAX_DIM}")


def check_record(
    record: Mapping[str, Any], env: EngineEnv, graph_sha256: Mapping[str, str], precision: str
) -> list[str]:
    """What keeps an engine set from running here: one line per difference, empty when it fits.

    Args:
        record: the set's ``engine.json``.
        env: this machine's TensorRT and GPU.
        graph_sha256: role -> SHA-256 of the bundle graph of ``precision`` (from the bundle manifest).
        precision: the precision asked for.
    """
    problems = []
    if record.get("precision") != precision:
        problems.append(f"precision {record.get('precision')}, not {precision}")
    built = record.get("env", {})
    if built.get("trt_version") != env.trt_version:
        problems.append(f"built with TensorRT {built.get('trt_version')}, this is TensorRT {env.trt_version}")
    if built.get("gpu_name") != env.gpu_name or built.get("compute_capability") != env.compute_capability:
        problems.append(
            f"built on {built.get('gpu_name')} (compute capability {built.get('compute_capability')}), this is "
            f"{env.gpu_name} ({env.compute_capability})"
        )
    engines = record.get("engines", {})
    for role, sha in graph_sha256.items():
        entry = engines.get(role)
        if entry is None:
            problems.append(f"no {role} engine")
        elif entry.get("graph_sha256") != sha:
            problems.append(
                f"the {role} engine was built from graph {str(entry.get('graph_sha256'))[:12]}…, the bundle's "
                f"{role} graph is {sha[:12]}… (re-exported since)"
            )
    return problems


def verify_plans(folder: Path, record: Mapping[str, Any]) -> None:
    """Each plan file stays inside the engine folder (:func:`engine_file`) and exists with its recorded SHA-256 (a
    truncated copy, or a file from elsewhere, must never reach TensorRT).

    Raises:
        EngineRecordError: naming the first escaping, missing or modified plan.
    """
    entries = [*record.get("engines", {}).values(), *record.get("gathers", {}).values()]
    for entry in entries:
        plan = engine_file(folder, entry.get("plan"), "plan")
        if not plan.is_file():
            raise EngineRecordError(f"{folder}: plan {entry.get('plan')!r} is missing")
        if sha256_file(plan) != entry.get("plan_sha256"):
            raise EngineRecordError(
                f"{plan}: SHA-256 differs from {RECORD_NAME} (modified or truncated); rebuild with edgecap engine"
            )


def engine_folders(bundle_path: Path) -> list[Path]:
    """The engine sets stored in a bundle, by name."""
    root = Path(bundle_path) / ENGINES_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def find_engines(
    bundle_path: Path,
    precision: str,
    env: EngineEnv,
    graph_sha256: Mapping[str, str],
    *,
    beam: int | None = None,
) -> tuple[Path, dict[str, Any]]:
    """The engine set of ``precision`` that fits this machine, this bundle and the decode ``beam``: the first of
    :func:`fitting_engines`.

    Raises:
        EngineMismatchError: as :func:`fitting_engines`.
    """
    return fitting_engines(bundle_path, precision, env, graph_sha256, beam=beam)[0]


def fitting_engines(
    bundle_path: Path,
    precision: str,
    env: EngineEnv,
    graph_sha256: Mapping[str, str],
    *,
    beam: int | None = None,
) -> list[tuple[Path, dict[str, Any]]]:
    """Every engine set of ``precision`` that fits this machine and bundle and serves ``beam`` hypotheses per image
    (None: any beam), best first: the smallest beam that serves the request (its buffers and profiles are the
    tightest), then the largest max batch (most images per call), then the folder name. A loader tries them in
    this order, so a set whose plans fail verification gives way to the next.

    Raises:
        EngineMismatchError: none fits; the message lists each set of that precision and why it does not fit (or
            that there is none) and the command that builds one.
    """
    wanted = 1 if beam is None else int(beam)
    fitting: list[tuple[tuple[int, int, str], Path, dict[str, Any]]] = []
    rejected: list[str] = []
    for folder in engine_folders(bundle_path):
        try:
            record = read_record(folder)
        except EngineRecordError as exc:
            rejected.append(str(exc))
            continue
        if record["precision"] != precision:
            continue
        problems = check_record(record, env, graph_sha256, precision)
        request = record.get("request", {})
        built_beam, max_batch = int(request.get("beam", 1)), int(request.get("max_batch", 1))
        if built_beam < wanted:
            problems.append(f"built for beam {built_beam}, decoding asks for beam {wanted}")
        if problems:
            rejected.append(f"{folder.name}: {'; '.join(problems)}")
            continue
        fitting.append(((built_beam, -max_batch, folder.name), folder, record))
    if fitting:
        return [(folder, record) for _, folder, record in sorted(fitting, key=lambda item: item[0])]
    build = f"edgecap engine {bundle_path} --precision {precision}" + (f" --beam {wanted}" if beam else "")
    if not rejected:
        raise EngineMismatchError(
            f"bundle {bundle_path} has no {precision} TensorRT engine for {env.describe()}: build one with `{build}`"
        )
    raise EngineMismatchError(
        f"bundle {bundle_path}: no {precision} TensorRT engine fits {env.describe()}, this bundle"
        f"{f' and beam {wanted}' if beam else ''}, so none is loaded ({' | '.join(rejected)}); build one with `{build}`"
    )
