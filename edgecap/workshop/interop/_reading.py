"""Reading official checkpoints and vocabulary files without executing pickled code unless the user says so.

``torch.load(weights_only=True)`` reads tensors, numbers, strings and containers only. A file that also holds
pickled Python objects (an ``argparse.Namespace`` of options, a data-loader state) is refused with a
:class:`CheckpointError` that names ``--trust-pickle``; with ``trust_pickle=True`` it is unpickled in full, which can
run arbitrary code, so only for files the user trusts. Plain ``pickle`` vocabulary files go through an unpickler
that refuses every class for the same reason. Text and JSON vocabulary files are read through
:func:`read_vocab_text` / :func:`read_vocab_json`, so a binary or malformed file is a :class:`CheckpointError` naming
it, never a decoding traceback.
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

__all__ = ["CheckpointError", "read_checkpoint", "read_pickle", "read_vocab_json", "read_vocab_text"]

#: Wrappers training scripts put around the weights (ExpansionNet v2 saves ``model_state_dict``).
_WRAPPERS = ("model_state_dict", "state_dict", "model")
_TRUST_HINT = (
    "re-run with --trust-pickle (trust_pickle=True) only if you trust where the file came from: "
    "unpickling can execute arbitrary code"
)


class CheckpointError(ValueError):
    """An official checkpoint or vocabulary file that cannot be imported; the message says what and why."""


def read_checkpoint(path: str | Path, trust_pickle: bool = False) -> dict[str, torch.Tensor]:
    """The flat ``{name: tensor}`` state dict of an official checkpoint (``.pth``/``.pt``/``.bin``/``.safetensors``).

    Unwraps ``model_state_dict``/``state_dict``/``model`` and strips a ``module.`` prefix (DataParallel/DDP).

    Raises:
        CheckpointError: missing or unreadable file, pickled objects without ``trust_pickle``, no tensors.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    if path.suffix == ".safetensors":
        try:
            tensors = load_file(str(path), device="cpu")
        except (OSError, SafetensorError) as exc:
            raise CheckpointError(f"{path}: cannot read safetensors: {exc}") from exc
        return _state_dict(tensors, path)  # the same checks and DDP "module." prefix as a torch file
    try:
        obj: Any = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = _refused_global(exc)
        if not reason:  # not a class the safe loader refused: garbage, or not a torch file at all
            raise CheckpointError(f"{path}: not a readable torch checkpoint ({_first_line(exc)})") from exc
        if not trust_pickle:
            raise CheckpointError(
                f"{path} holds pickled Python objects besides tensors, which torch.load(weights_only=True) refuses "
                f"({reason}); {_TRUST_HINT}"
            ) from exc
        obj = _load_trusted(path)
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable torch checkpoint ({_first_line(exc)})") from exc
    return _state_dict(obj, path)


def _refused_global(exc: BaseException) -> str:
    """The line in which the weights-only loader names the class or function it refused to load (``Unsupported
    global: …``, ``… unsupported GLOBAL posix.system …``; the wording varies by torch version), else ""."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    named = [line for line in lines if "unsupported global" in line.lower()]
    return _sentence(named[0]) if named else ""


def _sentence(text: str, limit: int = 300) -> str:
    """``text`` cut to ``limit`` characters at a word boundary, marked with an ellipsis: never mid-word."""
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    detail = [line for line in lines if line.startswith("Unsupported")]
    return _sentence((detail or lines or [type(exc).__name__])[0])


def _load_trusted(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # a trusted file can still be corrupt or need modules that are not installed
        raise CheckpointError(f"{path}: cannot unpickle even with --trust-pickle: {exc}") from exc


def _state_dict(obj: Any, path: Path) -> dict[str, torch.Tensor]:
    for wrapper in _WRAPPERS:
        if isinstance(obj, Mapping) and isinstance(obj.get(wrapper), Mapping):
            obj = obj[wrapper]
            break
    if not isinstance(obj, Mapping) or not obj:
        raise CheckpointError(f"{path}: no state dict found (expected a mapping of tensors, or one under {_WRAPPERS})")
    bad = sorted(str(k) for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor))
    if bad:
        raise CheckpointError(f"{path}: the state dict has entries that are not named tensors: {bad[:5]}")
    odd = sorted(k for k, v in obj.items() if v.dtype.is_complex or v.dtype == torch.bool)
    if odd:
        raise CheckpointError(f"{path}: tensors {odd[:5]} are complex or boolean; an official checkpoint has neither")
    state = dict(obj)
    if all(k.startswith("module.") for k in state):
        state = {k[len("module.") :]: v for k, v in state.items()}
    return state


class _NoClassUnpickler(pickle.Unpickler):
    """Builtin containers and scalars only: any class or function reference is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def read_pickle(path: str | Path, trust_pickle: bool = False) -> Any:
    """A pickle file of plain data (dicts, lists, strings, numbers); anything else needs ``trust_pickle``.

    Raises:
        CheckpointError: missing/corrupt file, or a file that references classes without ``trust_pickle``.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"file not found: {path}")
    data = path.read_bytes()
    try:
        return _NoClassUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        if "refusing to load" not in str(exc):
            raise CheckpointError(f"{path}: not a readable pickle: {exc}") from exc
        if not trust_pickle:
            raise CheckpointError(f"{path} references Python objects ({exc}); {_TRUST_HINT}") from exc
    except (EOFError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{path}: not a readable pickle: {exc}") from exc
    try:
        return pickle.loads(data)  # noqa: S301  (explicitly trusted by the caller)
    except Exception as exc:  # missing modules, corrupt payloads
        raise CheckpointError(f"{path}: cannot unpickle even with --trust-pickle: {exc}") from exc


def read_vocab_text(path: str | Path) -> str:
    """The text of a vocabulary file, or a :class:`CheckpointError` naming it (missing, binary, not UTF-8)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"vocabulary file not found: {path}")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        kind = "a pickle" if data[:1] == b"\x80" else "binary"
        raise CheckpointError(
            f"{path}: not a UTF-8 text vocabulary (byte {exc.start} cannot be decoded; the file looks {kind}): "
            "pass the source's text vocabulary file"
        ) from exc
    if "\x00" in text:
        raise CheckpointError(f"{path}: not a text vocabulary (it holds NUL bytes; a binary file?)")
    return text


def read_vocab_json(path: str | Path) -> Any:
    """A JSON vocabulary file, parsed, or a :class:`CheckpointError` naming it and the place it stops parsing."""
    path = Path(path)
    text = read_vocab_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from exc
    except RecursionError as exc:
        raise CheckpointError(f"{path}: not a usable JSON vocabulary (nested too deeply)") from exc
