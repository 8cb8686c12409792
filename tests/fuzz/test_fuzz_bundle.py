"""Fuzz the bundle reader on a copy of a tiny real bundle (tests/runtime/bundle/helpers.py ``region_bundle``).

``manifest.json``, ``config.json`` and ``vocab.json`` are mutated (fields, types, nasty paths, raw bytes); for an
edited config or vocabulary the manifest's size and SHA-256 are updated so the parser behind the integrity check is
exercised, not only the checksum. Properties: ``load_bundle`` returns or raises ``BundleError`` (subclasses
included: its documented errors); no file outside the bundle is opened (an audit hook records ``open`` events); no
example exceeds the profile's deadline.

The findings this suite made in the reader (a vocabulary or runtime file outside the bundle, fields of the wrong
JSON type raising ``TypeError``) are fixed; the ``test_finding_*`` examples at the bottom pin each one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgecap.runtime.bundle.manifest import BundleError
from edgecap.runtime.bundle.reader import load_bundle
from tests.runtime.bundle.helpers import region_bundle

from .strategies import NASTY_PATHS, byte_mutations, mutated_json

# -- open() audit ----------------------------------------------------------------------------------------------------

_OPENED: list[str] | None = None
_SYSTEM = tuple(
    str(Path(p).resolve())
    for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path}
    if p and Path(p).is_dir() and str(Path(p).resolve()) != "/"
) + ("/proc", "/sys", "/dev", "/usr", "/etc/localtime")


def _audit(name: str, args: tuple) -> None:
    if _OPENED is not None and name == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # audit hooks cannot be removed; this one records only while _OPENED is a list


def _outside(opened: list[str], bundle: Path) -> list[str]:
    inside = str(bundle.resolve())
    bad = []
    for name in opened:
        real = os.path.realpath(name)
        if real == inside or real.startswith(inside + os.sep):
            continue
        if not any(real == s or real.startswith(s + os.sep) for s in _SYSTEM if s != inside):
            bad.append(name)
    return bad


# -- fixtures --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pristine(tiny_data, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("fuzz-bundle")
    bundle = Path(shutil.copytree(region_bundle(tiny_data, tmp_path_factory), work / "bundle"))
    # Files an escaping path could reach: beside the bundle and above it.
    for target in (work / "outside.json", work / "vocab.json", work / "weights.safetensors"):
        shutil.copyfile(bundle / "vocab.json", target)
    texts = {name: (bundle / name).read_bytes() for name in ("manifest.json", "config.json", "vocab.json")}
    return _Pristine(bundle=bundle, bytes=texts, json={k: json.loads(v) for k, v in texts.items()})


class _Pristine(dict):
    """The bundle copy and its original JSON files; a short repr keeps hypothesis' failure reports readable."""

    def __repr__(self) -> str:
        return f"<pristine bundle {self['bundle']}>"


def _write(bundle: Path, pristine: dict[str, Any], name: str, data: bytes | None) -> None:
    """Restore the bundle, write ``data`` as ``name`` and, for config/vocab, record its size and hash."""
    for other, text in pristine["bytes"].items():
        (bundle / other).write_bytes(text)
    if data is None:
        return
    (bundle / name).write_bytes(data)
    if name != "manifest.json":
        manifest = json.loads(pristine["bytes"]["manifest.json"])
        manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        (bundle / "manifest.json").write_text(json.dumps(manifest))


def _load(bundle: Path, config: Any, verify: Any, graphs: str, manifest: Any = None) -> None:
    global _OPENED
    _OPENED, exc = [], None
    try:
        load_bundle(bundle, verify=verify, graphs=graphs)
    except BundleError:
        pass
    except Exception as err:  # noqa: BLE001 - classified below
        exc = err
    finally:
        opened, _OPENED = _OPENED, None
    outside = _outside(opened, bundle)
    if exc is None and not outside:
        return
    if exc is not None:
        raise exc
    raise AssertionError(f"load_bundle opened files outside the bundle: {outside}")


def _dump(doc: Any) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()


VERIFY = st.sampled_from([True, "used", False])


def test_seed_loads(pristine: dict[str, Any]) -> None:
    _write(pristine["bundle"], pristine, "config.json", None)
    _load(pristine["bundle"], pristine["json"]["config.json"], True, "all")


@given(data=st.data(), verify=VERIFY)
def test_mutated_config(pristine: dict[str, Any], data: st.DataObject, verify: Any) -> None:
    config = data.draw(mutated_json(pristine["json"]["config.json"]))
    _write(pristine["bundle"], pristine, "config.json", _dump(config))
    _load(pristine["bundle"], config, verify, "none")


@given(data=st.data(), verify=VERIFY)
def test_mutated_manifest(pristine: dict[str, Any], data: st.DataObject, verify: Any) -> None:
    manifest = data.draw(mutated_json(pristine["json"]["manifest.json"]))
    _write(pristine["bundle"], pristine, "manifest.json", _dump(manifest))
    graphs = data.draw(st.sampled_from(["none", "all"]))
    _load(pristine["bundle"], pristine["json"]["config.json"], verify, graphs, manifest)


@given(data=st.data(), verify=VERIFY)
def test_mutated_vocab(pristine: dict[str, Any], data: st.DataObject, verify: Any) -> None:
    vocab = data.draw(mutated_json(pristine["json"]["vocab.json"]))
    _write(pristine["bundle"], pristine, "vocab.json", _dump(vocab))
    _load(pristine["bundle"], pristine["json"]["config.json"], verify, "none")


@given(name=st.sampled_from(["manifest.json", "config.json"]), data=st.data())
def test_mutated_bytes(pristine: dict[str, Any], name: str, data: st.DataObject) -> None:
    raw = data.draw(byte_mutations(pristine["bytes"][name]))
    _write(pristine["bundle"], pristine, name, raw)
    _load(pristine["bundle"], pristine["json"]["config.json"], True, "none")


@given(key=st.sampled_from(["weights", "backbone_weights"]), value=st.sampled_from(NASTY_PATHS), verify=VERIFY)
def test_config_paths(pristine: dict[str, Any], key: str, value: str, verify: Any) -> None:
    config = {**pristine["json"]["config.json"], key: value}
    _write(pristine["bundle"], pristine, "config.json", _dump(config))
    _load(pristine["bundle"], config, verify, "none")


@given(value=st.sampled_from(NASTY_PATHS) | st.integers() | st.none() | st.lists(st.text(max_size=3)), verify=VERIFY)
def test_vocab_file_paths(pristine: dict[str, Any], value: Any, verify: Any) -> None:
    config = json.loads(pristine["bytes"]["config.json"])
    config["vocab"]["file"] = value
    _write(pristine["bundle"], pristine, "config.json", _dump(config))
    _load(pristine["bundle"], config, verify, "none")


# -- the findings this suite made, fixed: each must now load or raise BundleError, opening nothing outside ----------


def _strict(pristine: dict[str, Any], name: str, doc: Any, graphs: str) -> None:
    """Write ``doc`` as ``name`` and load the bundle with no allowance: BundleError or success, nothing outside."""
    global _OPENED
    _write(pristine["bundle"], pristine, name, _dump(doc))
    _OPENED = []
    try:
        load_bundle(pristine["bundle"], verify=True, graphs=graphs)
    except BundleError:
        pass
    finally:
        opened, _OPENED = _OPENED, None
    assert not _outside(opened, pristine["bundle"]), (
        f"opened outside the bundle: {_outside(opened, pristine['bundle'])}"
    )


def _strict_load(pristine: dict[str, Any], config: dict[str, Any]) -> None:
    _strict(pristine, "config.json", config, "none")


@pytest.mark.parametrize("name", ["../outside.json", "/etc/passwd"])
def test_finding_vocab_file_outside_bundle(pristine: dict[str, Any], name: str) -> None:
    config = json.loads(pristine["bytes"]["config.json"])
    config["vocab"]["file"] = name
    _strict_load(pristine, config)


@pytest.mark.parametrize("value", [None, 3, ["vocab.json"]])
def test_finding_vocab_file_wrong_type(pristine: dict[str, Any], value: Any) -> None:
    config = json.loads(pristine["bytes"]["config.json"])
    config["vocab"]["file"] = value
    _strict_load(pristine, config)


def _manifest_load(pristine: dict[str, Any], edit: Callable[[dict[str, Any]], None]) -> None:
    manifest = json.loads(pristine["bytes"]["manifest.json"])
    edit(manifest)
    _strict(pristine, "manifest.json", manifest, "all")


def test_finding_variant_file_masked_by_graphs(pristine: dict[str, Any]) -> None:
    _manifest_load(pristine, lambda m: m["variants"]["int8"]["files"].update(step="../outside.json"))


def test_finding_variant_file_null_masked_by_graphs(pristine: dict[str, Any]) -> None:
    _manifest_load(pristine, lambda m: m["variants"]["fp32"]["files"].update(encoder=None))


def test_finding_variant_graphs_not_an_object(pristine: dict[str, Any]) -> None:
    _manifest_load(pristine, lambda m: m["variants"]["fp32"].update(graphs=None))


def test_finding_interface_decoding_is_a_list(pristine: dict[str, Any]) -> None:
    _manifest_load(pristine, lambda m: m["interface"].update(decoding=["autoregressive"]))


@pytest.mark.parametrize("value", [["weights.safetensors"], {"a": 1}])
def test_finding_config_weights_wrong_type(pristine: dict[str, Any], value: Any) -> None:
    config = json.loads(pristine["bytes"]["config.json"])
    config["weights"] = value
    _strict_load(pristine, config)
