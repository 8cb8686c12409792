"""The bundle manifest: what a bundle holds, proven by checksums, and how well each exported variant did.

``manifest.json`` (format ``edgecap-bundle``) records the layout version, the software that wrote it, the ONNX opset
and graph interface, the SHA-256 and size of every other file, and per precision its graphs and checks. Its fields
are defined once, in ``manifest.schema.json`` next to this module: :func:`parse_manifest` checks a manifest against
it, and ``docs/formats/manifest.md`` is generated from it (``python -m edgecap.runtime.schema_docs``).

Nothing here imports torch or onnx: reading and checking a manifest is cheap on an edge board.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import math
import platform
from collections.abc import Collection, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from edgecap._version import __version__
from edgecap.runtime._versions import InvalidVersion, parse_version
from edgecap.runtime.backends.roles import DECODING_ROLES
from edgecap.runtime.bundle.limits import check_manifest_numbers
from edgecap.runtime.precisions import PRECISIONS
from edgecap.runtime.schema import check, json_path, load_schema

__all__ = [
    "DERIVED_DIRS",
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "PRECISION_ORDER",
    "SCHEMA_PATH",
    "BundleConfigError",
    "BundleError",
    "BundleIntegrityError",
    "BundleNotFoundError",
    "BundleVersionError",
    "bundle_file",
    "check_relative_path",
    "compression_recipe",
    "int8_selection",
    "quality_levels",
    "hash_files",
    "jsonable",
    "parse_manifest",
    "sha256_file",
    "software_versions",
    "summary_rows",
    "verify_files",
]

FORMAT = "edgecap-bundle"
#: Version of the bundle layout and manifest schema this edgecap writes and the newest it reads.
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
#: Top-level folders of artefacts built *from* a bundle on the machine that runs it (TensorRT engines, which depend
#: on the GPU and TensorRT version): outside the manifest's file list and checksums, so building one never breaks
#: verification; each records its own checksum and the graph checksum it was built from (``edgecap.runtime.engines``).
DERIVED_DIRS = ("engines",)
#: Precisions a bundle can hold, best-known first in reports.
PRECISION_ORDER = PRECISIONS  # the bundle-format name of edgecap.runtime.precisions.PRECISIONS


class BundleError(ValueError):
    """A bundle that cannot be used; the message names the bundle and the file or field at fault."""


class BundleNotFoundError(BundleError, FileNotFoundError):
    """The path is not a bundle directory (no ``manifest.json``)."""


class BundleIntegrityError(BundleError):
    """Files missing, unlisted, or whose bytes differ from the manifest's checksums."""


class BundleVersionError(BundleError):
    """A bundle written by a newer edgecap, or with graphs newer than the installed ONNX stack supports."""


class BundleConfigError(BundleError):
    """Parts of a bundle that do not belong together: config vs vocab, graphs vs the recorded interface."""


# -- hashing ---------------------------------------------------------------------------------------------------------
def sha256_file(path: str | Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _bundle_files(root: Path) -> list[str]:
    """Relative POSIX paths of every regular file under ``root``, except the manifest, hidden entries and the
    derived-artefact folders (:data:`DERIVED_DIRS`)."""
    out = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or rel.parts[0] in DERIVED_DIRS or not path.is_file():
            continue
        name = rel.as_posix()
        if name != MANIFEST_NAME:
            out.append(name)
    return out


def hash_files(root: str | Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {"sha256", "bytes"}}`` for every file of a bundle directory (the manifest excluded)."""
    root = Path(root)
    files = _bundle_files(root)
    return {name: {"sha256": sha256_file(root / name), "bytes": (root / name).stat().st_size} for name in files}


def check_relative_path(
    name: Any, where: str, error: type[ValueError] = BundleError, inside: str = "the bundle"
) -> str:
    """``name`` if it is a plain relative path inside the bundle (no absolute path, no ``..``), else ``error``
    (BundleError unless a caller, such as a run directory, names its own)."""
    if not isinstance(name, str):
        raise error(f"{where}: {name!r} is not a relative path inside {inside} (not a string)")
    pure = PurePosixPath(name)
    if ".." in pure.parts:
        raise error(f"{where}: {name!r} is not a relative path inside {inside} (its '..' escapes {inside})")
    if not name or pure.is_absolute() or "\\" in name or (len(name) > 1 and name[1] == ":"):
        raise error(f"{where}: {name!r} is not a relative path inside {inside}")
    return name


def bundle_file(
    root: str | Path,
    name: Any,
    where: str,
    listed: Collection[str] | None = None,
    error: type[ValueError] = BundleError,
    inside: str = "the bundle",
) -> Path:
    """The one path rule for every file a bundle (or a run directory) names: ``root / name`` when ``name`` is a
    relative path inside ``root`` (:func:`check_relative_path`), that stays inside ``root`` once symlinks are resolved,
    and, when ``listed`` is given (a manifest's ``files``), is one of the listed files; else ``error``.

    Checksums are verified separately (:func:`verify_files`), before a loader opens the file.
    """
    name = check_relative_path(name, where, error, inside)
    if listed is not None and name not in listed:
        raise error(f"{where}: {name!r} is not listed in the manifest's 'files' (every file a bundle uses must be)")
    base = Path(root).resolve()
    path = Path(root) / name
    target = path.resolve()
    if target != base and base not in target.parents:
        raise error(f"{where}: {name!r} resolves to {target}, outside {inside} {base} (a symlink leaving it?)")
    return path


# -- versions --------------------------------------------------------------------------------------------------------
#: Package -> the distributions that provide it (the first one installed gives the version).
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "onnx": ("onnx",),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-openvino"),
    "numpy": ("numpy",),
}


def installed_version(names: tuple[str, ...]) -> str | None:
    """The version of the first of the distributions ``names`` that is installed, from package metadata."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def software_versions() -> dict[str, str | None]:
    """Versions of the software that matters to a bundle, from package metadata (nothing is imported)."""
    versions: dict[str, str | None] = {"edgecap": __version__, "python": platform.python_version()}
    versions.update({key: installed_version(names) for key, names in DISTRIBUTIONS.items()})
    return versions


def is_newer_version(candidate: str, reference: str) -> bool:
    """``candidate > reference`` in :pep:`440` order (``0.2.0rc1 < 0.2.0 < 0.2.0.post1 < 0.10.0``); False when
    either is not a version, so an odd string in a bundle's manifest never stops it from loading."""
    try:
        return parse_version(candidate) > parse_version(reference)
    except InvalidVersion:
        return False


# -- JSON hygiene ----------------------------------------------------------------------------------------------------
def jsonable(value: Any) -> Any:
    """``value`` with tuples as lists, numpy scalars as Python numbers and NaN/inf as None (strict JSON)."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        value = value.item()  # numpy / torch scalars
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# -- validation ------------------------------------------------------------------------------------------------------
#: The schema of ``manifest.json`` (package data): what :func:`parse_manifest` checks and ``docs/formats/manifest.md``
#: is generated from (``python -m edgecap.runtime.schema_docs``).
SCHEMA_PATH = Path(__file__).with_name("manifest.schema.json")


def _check_newer(data: Any, where: str) -> None:
    """A bundle of a newer layout is refused before the schema: its manifest may look like nothing this one knows."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return
    version = data.get("format_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        written_by = data.get("versions", {}).get("edgecap") if isinstance(data.get("versions"), dict) else None
        raise BundleVersionError(
            f"{where}: bundle format version {version} is newer than this edgecap ({__version__}) supports "
            f"(up to {FORMAT_VERSION}); it was written by edgecap {written_by or '?'}. "
            "Upgrade edgecap (pip install -U edgecap) or re-export the bundle with this version."
        )


def parse_manifest(data: Any, where: str) -> dict[str, Any]:
    """Check a manifest against ``manifest.schema.json`` and the rules a schema cannot state, and return it.

    Errors name ``where`` (the file) and the JSON path of the field at fault.

    Raises:
        BundleVersionError: ``format_version`` is newer than :data:`FORMAT_VERSION`.
        BundleError: a field that breaks the schema; a path outside the bundle; a graph not listed in ``files``;
            a runtime role without a graph, or foreign to the decoding; a number beyond the limits.
    """
    _check_newer(data, where)
    check(data, load_schema(str(SCHEMA_PATH)), where, BundleError)
    interface = data["interface"]
    decoding = interface.get("decoding", "autoregressive")  # bundles written before the field: autoregressive
    roles = DECODING_ROLES.get(decoding)
    if roles is None:
        raise BundleError(
            f"{where}: $.interface.decoding: {decoding!r} is unknown to this edgecap (known: {list(DECODING_ROLES)}); "
            "upgrade edgecap"
        )
    foreign = [r for r in interface["runtime_graphs"] if r not in roles]
    if foreign:
        raise BundleError(
            f"{where}: $.interface.runtime_graphs: runtime role(s) {foreign} have no meaning for {decoding} decoding "
            f"(its roles: {list(roles)})"
        )
    files = data["files"]
    for name in files:
        check_relative_path(name, f"{where}: $.files")
    for precision, variant in data["variants"].items():
        vwhere = f"{where}: {json_path(('variants', precision))}"
        missing_roles = [r for r in interface["runtime_graphs"] if r not in variant["files"]]
        if missing_roles:
            raise BundleError(f"{vwhere}: no graph file for runtime role(s) {missing_roles}")
        for field in ("files", "graphs"):  # each checked: a file may be in both
            for role, name in variant.get(field, {}).items():
                fwhere = f"{where}: {json_path(('variants', precision, field, role))}"
                check_relative_path(name, fwhere)
                if name not in files:
                    raise BundleError(f"{fwhere}: graph file {name!r} is not listed in 'files'")
    check_manifest_numbers(data, where, BundleError)
    return data


def verify_files(root: str | Path, manifest: Mapping[str, Any], hashed: Collection[str] | None = None) -> None:
    """Check every listed file exists with the recorded size and SHA-256, and that no unlisted file is present.

    Hidden entries (``.DS_Store``, ``._*``) are ignored. All problems are reported in one error.

    Args:
        root: the bundle directory.
        manifest: its parsed manifest.
        hashed: hash only these listed files (sizes and presence are still checked for all): loading a bundle
            hashes the files it will use, not every precision's graphs.

    Raises:
        BundleIntegrityError: naming each missing, corrupt or unlisted file.
    """
    root = Path(root)
    listed: Mapping[str, Mapping[str, Any]] = manifest["files"]
    problems: list[str] = []
    for name, entry in listed.items():
        try:
            path = bundle_file(root, name, MANIFEST_NAME)
        except BundleError as exc:
            problems.append(str(exc))
            continue
        if not path.is_file():
            problems.append(f"{name}: missing (listed in {MANIFEST_NAME})")
            continue
        size = path.stat().st_size
        if size != entry["bytes"]:
            problems.append(f"{name}: {size} bytes, the manifest says {entry['bytes']} (truncated or modified)")
            continue
        if hashed is not None and name not in hashed:
            continue
        digest = sha256_file(path)
        if digest != entry["sha256"]:
            problems.append(
                f"{name}: SHA-256 {digest[:12]}… differs from the manifest's {entry['sha256'][:12]}… "
                "(corrupt or modified)"
            )
    unlisted = [name for name in _bundle_files(root) if name not in listed]
    problems.extend(f"{name}: not listed in {MANIFEST_NAME} (added after export)" for name in unlisted)
    if problems:
        shown = "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more" if len(problems) > 6 else "")
        raise BundleIntegrityError(
            f"bundle {root} failed verification: {shown}. Re-export it (edgecap export) or copy it again."
        )


# -- reports ---------------------------------------------------------------------------------------------------------
def _number(value: Any) -> float | None:
    """``value`` if it is a finite number, else None: a report shows a hand-edited field as unknown, never crashes."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return value if ok else None


def _objects(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value.values() if isinstance(v, Mapping)] if isinstance(value, Mapping) else []


def _worst_parity(parity: Mapping[str, Any]) -> tuple[float | None, float | None, bool | None]:
    """Largest ``max_abs / atol`` over every graph output: (max_abs, its atol, all passed)."""
    worst: tuple[float, float, float] | None = None
    passed = True
    for report in _objects(parity):
        passed = passed and bool(report.get("passed"))
        for out in _objects(report.get("outputs")):
            max_abs, atol = _number(out.get("max_abs")), _number(out.get("atol")) or 0.0
            if max_abs is None:
                return None, None, False
            ratio = max_abs / atol if atol else math.inf
            if worst is None or ratio > worst[0]:
                worst = (ratio, max_abs, atol)
    if worst is None:
        return None, None, None if not parity else passed
    return worst[1], worst[2], passed


def quality_levels(quality: Mapping[str, Any] | None) -> dict[int | None, dict[str, Any]]:
    """A variant's task-level check per length level: a ``*-len`` bundle's ``levels`` entries (each with the shared
    fields: set, images, decoding), else its one check at ``length_level`` (bundles exported before per-level
    checks, and models without length control: key None)."""
    if not isinstance(quality, Mapping):
        return {}
    levels = quality.get("levels")
    shared = {k: v for k, v in quality.items() if k != "levels"}
    if not isinstance(levels, Mapping) or not levels:
        return {shared.get("length_level"): shared}
    return {int(level): {**shared, **fields, "length_level": int(level)} for level, fields in levels.items()}


def summary_rows(manifest: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per variant, in :data:`PRECISION_ORDER`: size, worst parity error vs its tolerance, and the task-level
    check (CIDEr-D of FP32 and of the variant, their difference, caption agreement)."""
    files = manifest.get("files", {})
    rows = []
    for precision in PRECISION_ORDER:
        variant = manifest.get("variants", {}).get(precision)
        if variant is None:
            continue
        names = set(variant.get("files", {}).values())
        max_abs, atol, passed = _worst_parity(variant.get("parity") or {})
        quality = variant.get("quality") if isinstance(variant.get("quality"), Mapping) else {}
        rows.append(
            {
                "precision": precision,
                "bytes": sum(files.get(n, {}).get("bytes", 0) for n in names),
                "parity_passed": passed,
                "parity_max_abs": max_abs,
                "parity_atol": atol,
                "cider_d_reference": _number(quality.get("reference_cider_d")),
                "cider_d": _number(quality.get("candidate_cider_d")),
                "cider_d_delta": _number(quality.get("cider_d_delta")),
                "agreement": _number(quality.get("agreement")),
                "images": _number(quality.get("images")),
                "quality_set": quality.get("set") if isinstance(quality.get("set"), str) else None,
            }
        )
    return rows


def compression_recipe(manifest: Mapping[str, Any]) -> str | None:
    """The bundle's compression recipe (``"distillation+pruning"``, manifest ``compression.recipe``), or None for an
    uncompressed run or a bundle written before the field (a malformed field reads as None too)."""
    block = manifest.get("compression")
    recipe = block.get("recipe") if isinstance(block, Mapping) else None
    return recipe if isinstance(recipe, str) and recipe else None


def int8_selection(manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """The INT8 variant's accuracy-aware selection record (``variants.int8.selection``: target, ``kept_float``
    layers with their measured gains, held-out ``quality``, batch-1 ``latency``), or None when the INT8 variant is
    absent, was quantised fully, or the record is malformed. ``len(result["kept_float"])`` is the number of layers
    kept float, what a report names as "int8 (accuracy-aware, K float)"."""
    variant = (manifest.get("variants") or {}).get("int8")
    selection = variant.get("selection") if isinstance(variant, Mapping) else None
    if not isinstance(selection, Mapping) or not isinstance(selection.get("kept_float"), list):
        return None
    return dict(selection)
