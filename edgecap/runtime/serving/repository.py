"""A Triton model repository over edgecap bundles: one model per bundle, ``config.pbtxt`` + ``1/model.py``.

The layout is Triton's own (``<repo>/<model>/config.pbtxt``, ``<repo>/<model>/1/model.py``), so the same directory
runs on the official Triton container and on the server ``edgecap serve`` starts. The model is the Python backend
running :class:`edgecap.runtime.serving.triton_model.TritonPythonModel`; the bundle sits in the version directory
(``1/bundle``), copied, or linked when ``edgecap serve`` builds a throw-away repository. The config asks Triton for
dynamic batching with a queue limit (a full queue is refused at once, never a hang) and the instance count.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from edgecap.runtime.serving.protocol import (
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_PIXELS,
    INPUTS,
    OUTPUTS,
    PARAM_BUNDLE,
    PARAM_MAX_BATCH_BYTES,
    PARAM_MAX_PIXELS,
    PARAM_PRECISION,
    PARAM_RUNTIME,
    PARAM_THREADS,
    TensorSpec,
)

#: Triton model names: what its URLs (``/v2/models/<name>``) and file layout accept.
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

#: The model file of every repository model: edgecap's runtime, installed in the backend's Python environment.
MODEL_PY = '''"""Triton Python-backend model: edgecap's captioner over the bundle in this folder (docs/serving.md)."""

from edgecap.runtime.serving.triton_model import TritonPythonModel  # noqa: F401
'''


@dataclass(frozen=True)
class ServingOptions:
    """How Triton batches and runs each model (``edgecap serve`` / ``edgecap triton-repo`` options).

    Attributes:
        max_batch: most requests (images) Triton puts in one batch.
        max_queue_delay_us: how long a request may wait for batch-mates, in microseconds.
        max_queue_size: requests waiting beyond this are refused at once (0 = unbounded).
        instances: model instances (processes), each with its own captioner.
        runtime, precision, threads: as ``Captioner.load`` takes them, per instance.
        max_pixels: most pixels of one image the model decodes (checked from the header or shape first).
        max_batch_bytes: most input bytes one instance takes into one batch.
    """

    max_batch: int = 64
    max_queue_delay_us: int = 0
    max_queue_size: int = 256
    instances: int = 1
    runtime: str = "auto"
    precision: str = "auto"
    threads: int | str = "auto"
    max_pixels: int = DEFAULT_MAX_PIXELS
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES

    def __post_init__(self) -> None:
        for name, low, high in (
            ("max_batch", 1, 1 << 16),
            ("max_queue_delay_us", 0, 60_000_000),
            ("max_queue_size", 0, 1 << 24),
            ("instances", 1, 256),
            ("max_pixels", 1, 1 << 40),
            ("max_batch_bytes", 1, 1 << 40),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} must be an integer in {low}..{high}, got {value!r}")


def model_name_for(bundle: str | os.PathLike[str]) -> str:
    """The Triton model name of a bundle: its directory name (``acort-xsmall``), checked for Triton's URLs."""
    name = Path(bundle).resolve().name
    if not _MODEL_NAME.match(name):
        raise ValueError(
            f"bundle directory name {name!r} cannot be a Triton model name (letters, digits, '_', '.', '-'; "
            "at most 128): rename the directory"
        )
    return name


def _quoted(text: str) -> str:
    """A protobuf text-format string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class ModelConfig:
    """One repository model's ``config.pbtxt``, as a record (Triton's ``ModelConfig`` message, the fields edgecap
    sets): the Python backend, the wire contract's tensors, dynamic batching with a bounded queue, CPU instances.

    Attributes:
        name: the model name (its directory).
        max_batch_size: most requests Triton puts in one batch.
        inputs, outputs: the tensors (:data:`~edgecap.runtime.serving.protocol.INPUTS` / ``OUTPUTS``); every input is
            ragged-batched (a request's images come in one tensor).
        max_queue_delay_us, max_queue_size, instances: as :class:`ServingOptions`.
        parameters: the model's string parameters (``edgecap_*``), read back at load time.
    """

    name: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_queue_delay_us: int
    max_queue_size: int
    instances: int
    parameters: tuple[tuple[str, str], ...]
    backend: str = "python"

    @classmethod
    def for_bundle(cls, name: str, options: ServingOptions) -> ModelConfig:
        """The config of model ``name`` serving its bundle (``1/bundle``) with ``options``."""
        params = {
            PARAM_BUNDLE: "bundle",
            PARAM_RUNTIME: options.runtime,
            PARAM_PRECISION: options.precision,
            PARAM_THREADS: str(options.threads),
            PARAM_MAX_PIXELS: str(options.max_pixels),
            PARAM_MAX_BATCH_BYTES: str(options.max_batch_bytes),
        }
        return cls(
            name=name,
            max_batch_size=options.max_batch,
            inputs=INPUTS,
            outputs=OUTPUTS,
            max_queue_delay_us=options.max_queue_delay_us,
            max_queue_size=options.max_queue_size,
            instances=options.instances,
            parameters=tuple(params.items()),
        )

    def to_pbtxt(self) -> str:
        """The config in protobuf text format."""
        inputs = ",\n".join(f"  {{ {_tensor(t)} optional: {str(t.optional).lower()} allow_ragged_batch: true }}"
                            for t in self.inputs)  # fmt: skip
        outputs = ",\n".join(f"  {{ {_tensor(t)} }}" for t in self.outputs)
        parameters = "\n".join(
            f"parameters {{ key: {_quoted(k)} value: {{ string_value: {_quoted(v)} }} }}" for k, v in self.parameters
        )
        return f"""name: {_quoted(self.name)}
backend: {_quoted(self.backend)}
max_batch_size: {self.max_batch_size}
input [
{inputs}
]
output [
{outputs}
]
dynamic_batching {{
  max_queue_delay_microseconds: {self.max_queue_delay_us}
  default_queue_policy {{ max_queue_size: {self.max_queue_size} }}
}}
instance_group [ {{ count: {self.instances} kind: KIND_CPU }} ]
{parameters}
"""


def _tensor(tensor: TensorSpec) -> str:
    return f"name: {_quoted(tensor.name)} data_type: {tensor.dtype} dims: [ {', '.join(map(str, tensor.shape))} ]"


def config_pbtxt(name: str, options: ServingOptions) -> str:
    """The model's ``config.pbtxt`` (protobuf text format): backend, tensors, dynamic batching, instances."""
    return ModelConfig.for_bundle(name, options).to_pbtxt()


def _outside(dest: Path, bundle: Path) -> None:
    """Refuse a repository at, inside or around a bundle (its copy, and the staging folder beside ``dest``, would
    land inside the bundle being copied)."""
    where = dest.resolve()  # the real place, through any linked folder on the way
    if where == bundle or bundle in where.parents or where in bundle.parents:
        relation = "is" if where == bundle else "is inside" if bundle in where.parents else "contains"
        raise ValueError(f"{dest} {relation} the bundle {bundle}: write the model repository outside the bundles")


def write_triton_repository(
    bundles: Sequence[str | os.PathLike[str]],
    dest: str | os.PathLike[str],
    options: ServingOptions,
    *,
    link: bool = False,
) -> dict[str, Path]:
    """Write a model repository serving ``bundles`` at ``dest``; returns model name -> model directory.

    Everything is checked before anything is written (bundles readable, names unique and valid, ``dest`` absent, its
    parent writable and outside every bundle: a repository inside a bundle would copy itself into itself), and the
    repository appears at ``dest`` in one rename, so a failure leaves nothing behind.

    Args:
        link: symlink each bundle instead of copying it (a repository that lives as long as the server using it).
    """
    from edgecap.runtime._io import check_output_location
    from edgecap.runtime.bundle.reader import load_bundle

    dest = Path(dest)
    if dest.exists() or dest.is_symlink():
        raise FileExistsError(f"{dest} already exists: choose a new directory for the model repository")
    check_output_location(dest, existing="refuse", what="the model repository")
    parent = dest.absolute().parent
    names: dict[str, Path] = {}
    for bundle in bundles:
        name = model_name_for(bundle)
        if name in names:
            raise ValueError(f"two bundles would both be model {name!r} ({names[name]} and {bundle}): rename one")
        load_bundle(Path(bundle))  # a bundle that cannot be read fails here, not inside the server
        names[name] = Path(bundle).resolve()
        _outside(dest, names[name])
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=parent))
    try:
        for name, bundle in names.items():
            version = staging / name / "1"
            version.mkdir(parents=True)
            (staging / name / "config.pbtxt").write_text(config_pbtxt(name, options))
            (version / "model.py").write_text(MODEL_PY)
            if link:
                (version / "bundle").symlink_to(bundle, target_is_directory=True)
            else:
                shutil.copytree(bundle, version / "bundle")
        os.rename(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {name: dest / name for name in names}
