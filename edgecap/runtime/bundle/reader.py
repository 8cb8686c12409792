"""Opening a bundle: verify before trusting.

:func:`load_bundle` refuses, with a message naming the bundle and the file or field, a bundle whose

- manifest is missing, malformed, or of a format version newer than this edgecap reads;
- files are missing, unlisted, or differ from their recorded SHA-256 (truncated copy, bit rot, hand edits);
- vocabulary disagrees with ``config.json`` (kind or number of classes: the weights would decode to nonsense);
- numbers lie outside :mod:`edgecap.runtime.bundle.limits` (a caption of 10^9 words, a zero ``std``, an image of 10^6
px);
- ``manifest.json`` or any file it names resolves outside the bundle
(:func:`~edgecap.runtime.bundle.manifest.bundle_file`);
- graphs do not have the inputs/outputs the manifest's interface promises, or need a newer ONNX opset than the
  installed ``onnx`` knows.

Only ``json``/``pathlib`` are imported up front; onnx (the optional graph check) and the vocabulary code are
imported when a check or a load needs them, so opening a bundle on an edge board stays fast. Where bundles and runs
live and how a directory is told apart is :mod:`edgecap.runtime.bundle.layout`'s.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgecap._version import __version__
from edgecap.runtime.bundle.layout import (
    CONFIG_NAME,
    VOCAB_NAME,
    WEIGHTS_NAME,
    describe_directory,
)
from edgecap.runtime.bundle.limits import check_config_numbers
from edgecap.runtime.bundle.manifest import (
    MANIFEST_NAME,
    PRECISION_ORDER,
    BundleConfigError,
    BundleError,
    BundleIntegrityError,
    BundleNotFoundError,
    BundleVersionError,
    bundle_file,
    is_newer_version,
    parse_manifest,
    summary_rows,
    verify_files,
)

__all__ = [
    "LENGTH_LEVEL",
    "Bundle",
    "load_bundle",
]

log = logging.getLogger(__name__)

#: The graph input that carries a 1-based length level (LaBERT's ``refine``, a ``*-len`` model's encoder).
LENGTH_LEVEL = "length_level"


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path}: cannot read the {what}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise BundleError(f"{path}: the {what} is not valid JSON: {exc}") from exc
    except ValueError as exc:  # an integer longer than Python converts (sys.get_int_max_str_digits)
        raise BundleError(f"{path}: the {what} holds a number too long to read: {exc}") from None
    except RecursionError:
        raise BundleError(f"{path}: the {what} nests its JSON too deeply to read") from None


def _field(data: Mapping[str, Any], key: str, kinds: tuple[type, ...], where: str) -> Any:
    if key not in data:
        raise BundleConfigError(f"{where}: field {key!r} is missing")
    value = data[key]
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = "/".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise BundleConfigError(f"{where}: field {key!r} must be {names}, got {type(value).__name__}")
    return value


def _parse_config(config: Any, where: str) -> dict[str, Any]:
    if not isinstance(config, dict):
        raise BundleConfigError(f"{where}: expected a JSON object")
    model = _field(config, "model", (dict,), where)
    _field(model, "name", (str,), f"{where} model")
    _field(model, "vocab_size", (int,), f"{where} model")
    _field(model, "feature_dim", (int, type(None)), f"{where} model")
    vocab = _field(config, "vocab", (dict,), where)
    _field(vocab, "kind", (str,), f"{where} vocab")
    _field(vocab, "size", (int,), f"{where} vocab")
    decode = _field(config, "decode", (dict,), where)
    for key in ("max_words", "beam"):  # bounds: check_config_numbers
        _field(decode, key, (int,), f"{where} decode")
    _field(config, "backbone", (dict, type(None)), where)
    _field(config, "backbone_in_graph", (bool,), where)
    _field(config, "backbone_weights", (str, type(None)), where)
    if config["backbone_in_graph"] and not config["backbone"]:
        raise BundleConfigError(f"{where}: backbone_in_graph is true but no backbone spec is recorded")
    check_config_numbers(config, where, BundleConfigError)
    return config


@dataclass(frozen=True)
class Bundle:
    """A verified bundle directory: its manifest and config, and accessors for what runtimes need.

    Attributes:
        path: the bundle directory.
        manifest: ``manifest.json`` (see :mod:`edgecap.runtime.bundle.manifest`).
        config: ``config.json``: model (name, overrides, sizes), vocab kind/size, backbone spec, decode defaults.
        verified: the files whose SHA-256 was checked already (:meth:`verify` hashes each file once).
    """

    path: Path
    manifest: dict[str, Any]
    config: dict[str, Any]
    verified: set[str] = field(default_factory=set, compare=False, repr=False)

    # -- what it is ------------------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return str(self.config["model"]["name"])

    @property
    def precisions(self) -> tuple[str, ...]:
        """Precisions this bundle holds, in :data:`~edgecap.runtime.bundle.manifest.PRECISION_ORDER`."""
        return tuple(p for p in PRECISION_ORDER if p in self.manifest["variants"])

    @property
    def interface(self) -> dict[str, Any]:
        """``decode_inputs``, ``state_names``, ``runtime_graphs`` (role -> graph) of the exported graphs."""
        return self.manifest["interface"]

    @property
    def decode_inputs(self) -> tuple[str, ...]:
        return tuple(self.interface["decode_inputs"])

    @property
    def state_names(self) -> tuple[str, ...]:
        return tuple(self.interface["state_names"])

    @property
    def updated_state_names(self) -> tuple[str, ...]:
        """The states the step graph outputs (bundles written before this field: all of them)."""
        return tuple(self.interface.get("updated_state_names") or self.interface["state_names"])

    @property
    def decoding(self) -> str:
        """``"autoregressive"`` (roles ``encoder`` + ``step``) or ``"mask_predict"`` (``encoder`` + ``refine``)."""
        return str(self.interface.get("decoding", "autoregressive"))

    @property
    def length_levels(self) -> tuple[tuple[int, int], ...]:
        """``((L_low, L_high), ...)`` of a length-controllable model (LaBERT, ``*-len``), else ``()``."""
        record = self.interface.get("length") or {}
        return tuple((int(lo), int(hi)) for lo, hi in record.get("levels", ()))

    @property
    def default_length_level(self) -> int | None:
        """The level used when a caller gives none (recorded at export), None without length control.

        Bundles exported before the record whose encoder takes ``length_level`` get the package default.
        """
        record = self.interface.get("length") or {}
        if record.get("default_level") is not None:
            return int(record["default_level"])
        if LENGTH_LEVEL in self.decode_inputs or self.decoding == "mask_predict":
            from edgecap.runtime.captioning import DEFAULT_LENGTH_LEVEL

            return DEFAULT_LENGTH_LEVEL
        return None

    @property
    def backbone_spec(self) -> dict[str, Any]:
        return self.config.get("backbone") or {}

    @property
    def backbone_in_graph(self) -> bool:
        """True when the encoder graph takes ``pixel_values`` (the bundle goes from pixels to captions)."""
        return bool(self.config["backbone_in_graph"])

    @property
    def backbone_weights(self) -> Path | None:
        """The backbone's local weights file carried in the bundle (None for packaged or absent weights)."""
        name = self.config.get("backbone_weights")
        return self.file(name, f"{CONFIG_NAME} backbone_weights") if name else None

    @property
    def max_words(self) -> int:
        return int(self.config["decode"]["max_words"])

    @property
    def beam(self) -> int:
        return int(self.config["decode"]["beam"])

    # -- variants --------------------------------------------------------------------------------------------------
    def variant(self, precision: str) -> dict[str, Any]:
        """The manifest entry of one precision (files, parity, quality)."""
        try:
            return self.manifest["variants"][precision]
        except KeyError:
            raise BundleError(
                f"bundle {self.path} has no {precision!r} variant (it holds {list(self.precisions)}); "
                f"re-export with {'--fp16' if precision == 'fp16' else '--int8 --calib DIR'} to add it"
            ) from None

    def graph_path(self, precision: str, role: str) -> Path:
        """The file of runtime role ``role`` (``"encoder"``, ``"step"`` or ``"refine"``) at ``precision``."""
        files = self.variant(precision)["files"]
        if role not in files:
            raise BundleError(f"bundle {self.path}: the {precision} variant has no {role!r} graph ({sorted(files)})")
        return self.file(files[role], f"{MANIFEST_NAME} variants[{precision!r}] files[{role!r}]")

    def int8_schemes(self) -> dict[str, dict[str, Any]]:
        """How each runtime role of the INT8 variant was quantised (``scheme``, ``bits``, ``ops`` …): the manifest's
        record; bundles exported before it was written hold static Q/DQ INT8 in every role.

        Raises:
            BundleError: the bundle has no INT8 variant.
        """
        variant = self.variant("int8")
        recorded = variant.get("schemes") or {}
        return {role: dict(recorded.get(role) or {"scheme": "static", "bits": 8}) for role in variant["files"]}

    def quality(self, precision: str) -> dict[str, Any] | None:
        """The task-level check of a variant (CIDEr-D/agreement vs FP32 on the held-out set), if one was run."""
        return self.variant(precision).get("quality")

    def summary(self) -> list[dict[str, Any]]:
        """One row per variant: size, parity, task-level quality
        (:func:`~edgecap.runtime.bundle.manifest.summary_rows`)."""
        return summary_rows(self.manifest)

    # -- files -----------------------------------------------------------------------------------------------------
    def file(self, name: Any, where: str) -> Path:
        """The path of a file the bundle names (``where`` says which field, for errors) under the one path rule:
        relative, inside the bundle once symlinks are resolved, and listed in the manifest's ``files``
        (:func:`~edgecap.runtime.bundle.manifest.bundle_file`). Checksums are :meth:`verify`'s job, before a loader
        reads it.

        Raises:
            BundleIntegrityError: the name breaks the rule.
        """
        try:
            return bundle_file(self.path, name, f"bundle {self.path}: {where}", self.manifest["files"])
        except BundleError as exc:
            raise BundleIntegrityError(str(exc)) from None

    @property
    def vocab_file(self) -> str:
        """The vocabulary's name in the bundle (``config.json``'s ``vocab.file``, ``vocab.json`` by default)."""
        return self.config["vocab"].get("file", VOCAB_NAME)

    @property
    def weights_file(self) -> str:
        """The torch weights' name in the bundle (``config.json``'s ``weights``, ``weights.safetensors`` by default)."""
        return self.config.get("weights", WEIGHTS_NAME)

    def named_files(self) -> dict[str, str]:
        """Every file ``config.json`` names, by field: the vocabulary, the torch weights and the backbone weights."""
        named = {"vocab.file": self.vocab_file, "weights": self.weights_file}
        if self.config.get("backbone_weights") is not None:
            named["backbone_weights"] = self.config["backbone_weights"]
        return named

    # -- loading parts ---------------------------------------------------------------------------------------------
    def load_vocab(self) -> Any:
        from edgecap.runtime.vocab import load_vocab

        path = self.file(self.vocab_file, f"{CONFIG_NAME} vocab.file")
        try:
            return load_vocab(path)
        except (ValueError, FileNotFoundError, RecursionError) as exc:
            raise BundleConfigError(f"bundle {self.path}: cannot load the vocabulary {path.name}: {exc}") from exc

    # -- checks ----------------------------------------------------------------------------------------------------
    def check_graphs(self, precisions: Sequence[str] | None = None) -> None:
        """Check the runtime graphs of ``precisions`` (default all) against the manifest's interface and the
        installed ONNX opset. Skipped, with a log line, when ``onnx`` is not installed (the runtime then reports a
        mismatch on its first call).

        Raises:
            BundleConfigError: a graph's inputs/outputs differ from the interface.
            BundleVersionError: a graph needs a newer opset than the installed ``onnx`` supports.
        """
        try:
            import onnx
        except ImportError:
            log.info("onnx is not installed: skipping the graph interface check of %s", self.path)
            return
        supported = onnx.defs.onnx_opset_version()
        for precision in precisions if precisions is not None else self.precisions:
            for role, name in self.variant(precision)["files"].items():
                path = self.file(name, f"{MANIFEST_NAME} variants[{precision!r}] files[{role!r}]")
                try:
                    model = onnx.load(str(path), load_external_data=False)
                except Exception as exc:  # protobuf raises DecodeError and friends
                    raise BundleIntegrityError(f"{path}: not a readable ONNX model: {exc}") from exc
                opset = max((imp.version for imp in model.opset_import if imp.domain in ("", "ai.onnx")), default=0)
                if opset > supported:
                    raise BundleVersionError(
                        f"{path}: graph uses ONNX opset {opset}, the installed onnx {onnx.__version__} supports up "
                        f"to {supported}: upgrade onnx/onnxruntime"
                    )
                initializers = {t.name for t in model.graph.initializer}
                inputs = [i.name for i in model.graph.input if i.name not in initializers]
                self.check_interface(role, inputs, [o.name for o in model.graph.output], path)

    def used_files(self, precision: str | None = None, *, weights: bool = False) -> list[str]:
        """The bundle files a runtime reads: ``config.json``, the vocabulary, the graphs of ``precision`` (if any),
        the torch weights (``weights=True``) and the backbone weights the bundle carries."""
        names = [CONFIG_NAME, self.vocab_file]
        if precision is not None:
            names += list(self.variant(precision)["files"].values())
        if weights:
            names.append(self.weights_file)
        if self.config.get("backbone_weights"):
            names.append(self.config["backbone_weights"])
        return list(dict.fromkeys(names))

    def verify(self, names: Sequence[str]) -> None:
        """Check the size and SHA-256 of the listed files ``names`` (what ``Captioner.load`` is about to read).

        Raises:
            BundleIntegrityError: naming each missing, corrupt or unlisted file.
        """
        todo = frozenset(names) - self.verified
        if todo:
            verify_files(self.path, self.manifest, hashed=todo)
            self.verified.update(todo)

    def check_interface(self, role: str, inputs: Sequence[str], outputs: Collection[str], path: str | Path) -> None:
        """Check one runtime graph's input and output names against the manifest's interface; runtimes call this
        with their session's own metadata, so loading never parses a graph twice.

        Raises:
            BundleConfigError: naming what is missing or unexpected.
        """
        inputs, outputs = list(inputs), set(outputs)
        interface = self.interface
        states = list(interface["state_names"])
        suffix = interface.get("state_output_suffix", "_out")
        if role == "encoder":
            want_in, want_out = list(interface["decode_inputs"]), states
        elif role == "step":
            tokens, logprobs = interface.get("tokens", "tokens"), interface.get("logprobs", "logprobs")
            updated = self.updated_state_names
            want_in, want_out = [tokens, *states], [logprobs, *(f"{s}{suffix}" for s in updated)]
        elif role == "refine":  # a whole caption per pass at a length level (mask-predict)
            tokens, logprobs = interface.get("tokens", "tokens"), interface.get("logprobs", "logprobs")
            want_in, want_out = [tokens, LENGTH_LEVEL, *states], [logprobs]
        else:
            raise BundleConfigError(f"{path}: unknown runtime role {role!r} in the manifest")
        missing = [n for n in want_in if n not in inputs]
        unexpected = [n for n in inputs if n not in want_in]
        absent = [n for n in want_out if n not in outputs]
        if missing or unexpected or absent:
            parts = []
            if missing:
                parts.append(f"missing input(s) {missing}")
            if unexpected:
                parts.append(f"unexpected input(s) {unexpected}")
            if absent:
                parts.append(f"missing output(s) {absent}")
            raise BundleConfigError(
                f"{path}: the {role} graph does not match the bundle's interface ({'; '.join(parts)}; "
                f"expected inputs {want_in}): the graph belongs to another model or export"
            )


def load_bundle(path: str | Path, *, verify: bool | str = True, graphs: str | Sequence[str] = "all") -> Bundle:
    """Open and verify a bundle directory.

    Args:
        path: the bundle directory.
        verify: ``True`` checks every file's size and SHA-256 against the manifest (and that none is missing or
            unlisted); ``"used"`` checks every file's presence and size but hashes only ``config.json`` and the
            vocabulary, leaving the graphs and weights a runtime reads to :meth:`Bundle.verify` (what
            ``Captioner.load`` does); ``False`` checks nothing.
        graphs: ``"all"`` checks every variant's runtime graphs against the interface, ``"none"`` skips it, or a
            list of precisions to check (``Captioner.load`` checks only the one it runs).

    Raises:
        BundleNotFoundError: ``path`` is not a bundle.
        BundleVersionError, BundleIntegrityError, BundleConfigError, BundleError: see the module docstring.
    """
    path = Path(path)
    manifest_path = path / MANIFEST_NAME
    if not path.is_dir():
        raise BundleNotFoundError(f"bundle not found: {path} is not a directory")
    if not manifest_path.is_file():
        raise BundleNotFoundError(describe_directory(path, "bundle"))
    bundle_file(path, MANIFEST_NAME, f"bundle {path}", error=BundleIntegrityError)  # a symlink may not leave it
    manifest = parse_manifest(_read_json(manifest_path, "bundle manifest"), str(manifest_path))
    if verify not in (True, False, "used"):
        raise ValueError(f"verify must be True, False or 'used', got {verify!r}")
    if verify is True:
        verify_files(path, manifest)
    elif verify == "used":
        verify_files(path, manifest, hashed=frozenset({CONFIG_NAME}))
    config_path = path / CONFIG_NAME
    if CONFIG_NAME not in manifest["files"] or not config_path.is_file():
        raise BundleIntegrityError(f"bundle {path}: {CONFIG_NAME} is missing")
    bundle_file(path, CONFIG_NAME, f"bundle {path}: {MANIFEST_NAME}", manifest["files"], BundleIntegrityError)
    config = _parse_config(_read_json(config_path, "bundle config"), str(config_path))
    if manifest["model"]["name"] != config["model"]["name"]:
        raise BundleConfigError(
            f"bundle {path}: {MANIFEST_NAME} describes model {manifest['model']['name']!r} but {CONFIG_NAME} "
            f"describes {config['model']['name']!r}"
        )
    written_by = str(manifest["versions"].get("edgecap") or "")
    if written_by and is_newer_version(written_by, __version__):
        log.warning("bundle %s was written by edgecap %s, newer than this %s", path, written_by, __version__)
    hashed = set(manifest["files"]) if verify is True else {CONFIG_NAME} if verify == "used" else set()
    bundle = Bundle(path=path, manifest=manifest, config=config, verified=hashed)
    for key, name in bundle.named_files().items():  # every file config.json names, under the one path rule
        bundle.file(name, f"{CONFIG_NAME} {key}")
    if verify == "used":
        bundle.verify(bundle.used_files())
    _check_vocab(bundle)
    if graphs == "all":
        bundle.check_graphs()
    elif graphs != "none":
        bundle.check_graphs([graphs] if isinstance(graphs, str) else list(graphs))
    return bundle


def _check_vocab(bundle: Bundle) -> None:
    vocab = bundle.load_vocab()
    recorded = bundle.config["vocab"]
    problems = []
    if vocab.kind != recorded["kind"]:
        problems.append(f"kind {vocab.kind!r} vs {recorded['kind']!r}")
    if vocab.size != recorded["size"]:
        problems.append(f"{vocab.size} classes vs {recorded['size']}")
    if vocab.size != bundle.config["model"]["vocab_size"]:
        problems.append(f"{vocab.size} classes vs the model's {bundle.config['model']['vocab_size']} outputs")
    if problems:
        raise BundleConfigError(
            f"bundle {bundle.path}: {bundle.vocab_file} does not match {CONFIG_NAME} "
            f"({'; '.join(problems)}): vocabulary and weights do not belong together"
        )
