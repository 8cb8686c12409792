"""Writing a bundle atomically: everything goes into a hidden temporary sibling directory, the manifest is written
last from the bytes actually on disk, the finished directory is verified by the reader, and only then renamed onto
the target. An exception or Ctrl-C at any point removes the temporary directory and leaves no half-written bundle
(and an existing bundle untouched)."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edgecap.runtime._io import _apply_default_mode, atomic_directory
from edgecap.runtime.bundle.manifest import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    BundleError,
    check_relative_path,
    hash_files,
    jsonable,
    software_versions,
)

__all__ = ["BundleBuilder", "create_bundle", "json_bytes"]


def json_bytes(obj: Any) -> bytes:
    """Strict JSON (NaN/inf become null), indented, UTF-8, newline-terminated."""
    return (json.dumps(jsonable(obj), indent=2, allow_nan=False) + "\n").encode("utf-8")


class BundleBuilder:
    """The files of a bundle under construction in ``root`` (a temporary directory owned by :func:`create_bundle`).

    Every writer takes a path relative to the bundle root; parents are created as needed.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.manifest: dict[str, Any] | None = None

    def path(self, name: str) -> Path:
        path = self.root / check_relative_path(name, "bundle writer")
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def write_bytes(self, name: str, data: bytes) -> Path:
        if name == MANIFEST_NAME:
            raise BundleError(f"{MANIFEST_NAME} is written by finalize(), not by hand")
        path = self.path(name)
        path.write_bytes(data)
        return path

    def write_json(self, name: str, obj: Any) -> Path:
        return self.write_bytes(name, json_bytes(obj))

    def write_model(self, name: str, model: Any) -> Path:
        """An ONNX ``ModelProto`` as one self-contained file (bundled graphs never use external data)."""
        return self.write_bytes(name, model.SerializeToString())

    def copy_file(self, src: str | Path, name: str) -> Path:
        src = Path(src)
        if not src.is_file():
            raise FileNotFoundError(f"cannot add {src} to the bundle: not a file")
        path = self.path(name)
        shutil.copyfile(src, path)
        return path

    def finalize(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """Write ``manifest.json``: format, creation time, software versions, the caller's ``fields`` (model,
        opset, interface, variants, …) and the checksum of every file now in the bundle; then verify the whole
        directory with the reader, exactly as a user's load would.

        Returns:
            The manifest.
        """
        from edgecap.runtime.bundle.reader import load_bundle

        for path in self.root.rglob("*"):
            # some writers (safetensors) create private 0600 files; a bundle is meant to be copied and shared
            _apply_default_mode(path, 0o777 if path.is_dir() else 0o666)
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "versions": software_versions(),
            **dict(fields),
            "files": hash_files(self.root),
        }
        (self.root / MANIFEST_NAME).write_bytes(json_bytes(manifest))
        load_bundle(self.root, graphs="all")
        self.manifest = json.loads((self.root / MANIFEST_NAME).read_text(encoding="utf-8"))
        return self.manifest


@contextlib.contextmanager
def create_bundle(out: str | Path, *, overwrite: bool = False) -> Iterator[BundleBuilder]:
    """Build a bundle at ``out`` atomically::

        with create_bundle("my-bundle") as bundle:
            bundle.write_json("config.json", config)
            ...
            bundle.finalize({"model": ..., "variants": ...})

    Raises:
        FileExistsError: ``out`` exists and ``overwrite`` is False (checked before anything is written).
        BundleError: the block ended without :meth:`BundleBuilder.finalize` (nothing is moved into place).
    """
    with atomic_directory(out, overwrite=overwrite) as tmp:
        builder = BundleBuilder(Path(tmp))
        yield builder
        if builder.manifest is None:
            raise BundleError(f"bundle {out} was not finalised (no manifest); nothing was written")
