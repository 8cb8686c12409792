""" "ort" names the Object Relation Transformer model family only: no identifier or option value in the package spells
ONNX Runtime that way any more (its names spell ``onnxruntime``/``OnnxRuntime``).

The family's own names are allowed file by file below; ONNX Runtime's own API names (``ORT_ENABLE_BASIC``,
``OrtValue``) are allowed as attributes of the module; earlier spellings still accepted with a warning are allowed
where they are listed as such (a ``*RENAMED*`` or ``LEGACY_*`` table, a runtime's ``aliases``).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import edgecap

ROOT = Path(edgecap.__file__).resolve().parent.parent
PACKAGE = Path(edgecap.__file__).resolve().parent

#: The Object Relation Transformer family's modules and the names in them that spell "ort" for the family.
FAMILY_NAMES: dict[str, set[str]] = {
    "edgecap/workshop/models/ort.py": {
        "ORTCaptioner",
        "_ort",
        "_ort_cfg",
        "ort_base",
        "ort_base_2",
        "ort_base_4",
        "ort_base_len",
        "ort_small",
        "ort_test",
        "ort_xsmall",
    },
    "edgecap/workshop/models/_ort_cfg.py": set(),
    "edgecap/workshop/models/__init__.py": {"ORTCaptioner", "_ort_cfg", "ort"},
    "edgecap/workshop/models/reference.py": {
        "ORT_REFERENCE_SWITCHES",
        "ort",
        "ort_base",
        "ort_base_ref",
        "ort_test",
        "ort_test_ref",
    },
    "edgecap/workshop/export/specs/ort.py": {"ORT_FP16", "ORT_TOLERANCES", "ort_export_spec"},
    "edgecap/workshop/interop/ort.py": {"ORT_MAX_TOKENS", "ORT_MAX_WORDS", "import_ort"},
    "edgecap/workshop/interop/acort.py": set(),
}
#: Modules whose string values name the family ("ort-base-ref", ``--from ort``, help text on official checkpoints).
FAMILY_TEXT = {
    *FAMILY_NAMES,
    "edgecap/workshop/interop/_families.py",
    "edgecap/workshop/interop/_relation_transformer.py",
    "edgecap/workshop/interop/_vocab.py",
    "edgecap/workshop/interop/convert.py",
    "edgecap/workshop/interop/sources.py",
    "edgecap/cli/importing.py",
    "edgecap/cli/__init__.py",
    "edgecap/workshop/export/specs/layer_caches.py",
    "edgecap/workshop/training/scst_loop.py",
    "edgecap/workshop/compression/prune.py",  # structured pruning supports the ORT/ACORT family
    "edgecap/cli/prune.py",
}
#: Modules whose earlier names are still to be renamed (they run through the warning aliases meanwhile).
NOT_RENAMED_YET: dict[str, set[str]] = {}
#: ONNX Runtime's own API names, allowed only as attributes (``onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL``).
ONNXRUNTIME_API = {
    "ORT_DISABLE_ALL",
    "ORT_ENABLE_BASIC",
    "ORT_ENABLE_EXTENDED",
    "ORT_ENABLE_ALL",
    "ORT_PARALLEL",
    "ORT_SEQUENTIAL",
    "OrtValue",
}
#: Assignments whose string values list earlier spellings, still accepted or read.
OLD_SPELLINGS = re.compile(r"RENAMED|LEGACY")
_ORT_WORD = re.compile(r"(?<![A-Za-z0-9])ort(?![A-Za-z0-9])", re.IGNORECASE)


def _words(name: str) -> list[str]:
    """``create_ort_decoder`` -> create, ort, decoder; ``OrtRuntime`` -> ort, runtime; ``ORT_TYPES`` -> ort, types."""
    return [w.lower() for part in name.split("_") for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", part)]


def _modules() -> list[tuple[str, str]]:
    return [(p.relative_to(ROOT).as_posix(), p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))]


def _ort_identifiers(source: str, allowed: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every name token that has "ort" as a word and is not allowed; ONNX Runtime's API names pass
    after a dot."""
    found, previous = [], None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        api = tok.string in ONNXRUNTIME_API and previous == "."
        if tok.type == tokenize.NAME and "ort" in _words(tok.string) and tok.string not in allowed and not api:
            found.append((tok.start[0], tok.string))
        if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
            previous = tok.string
    return found


def _old_spelling_values(tree: ast.AST) -> set[int]:
    """ids of the string constants that list earlier spellings (a ``*RENAMED*``/``LEGACY_*`` table, ``aliases=``)."""
    tables: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and OLD_SPELLINGS.search(t.id) for t in targets) and node.value:
                tables.append(node.value)
        elif isinstance(node, ast.keyword) and node.arg == "aliases":
            tables.append(node.value)
    return {id(c) for table in tables for c in ast.walk(table) if isinstance(c, ast.Constant)}


def _docstrings(tree: ast.AST) -> set[int]:
    holders = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, holders) and node.body and isinstance(node.body[0], ast.Expr)
    }


def _ort_values(source: str) -> list[tuple[int, str]]:
    """(line, text) of string values (not docstrings, not old-spelling tables) with "ort" as a word."""
    tree = ast.parse(source)
    skip = _old_spelling_values(tree) | _docstrings(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
        if _ORT_WORD.search(node.value)
    ]


def test_no_identifier_spells_onnxruntime_as_ort() -> None:
    bad = [
        f"{path}:{line}: {name}"
        for path, source in _modules()
        for line, name in _ort_identifiers(source, FAMILY_NAMES.get(path, set()) | NOT_RENAMED_YET.get(path, set()))
    ]
    assert not bad, "names onnxruntime/OnnxRuntime, not ort (the model family's name):\n" + "\n".join(bad)


def test_no_option_value_or_key_spells_onnxruntime_as_ort() -> None:
    bad = [
        f"{path}:{line}: {text!r}"
        for path, source in _modules()
        if path not in FAMILY_TEXT
        for line, text in _ort_values(source)
        if text not in NOT_RENAMED_YET.get(path, set())
    ]
    assert not bad, "values spell onnxruntime, not ort (the model family's name):\n" + "\n".join(bad)


def test_the_family_allow_list_names_existing_modules_and_names() -> None:
    """A stale entry would let a new ``ort`` name in under an old file's cover."""
    modules = dict(_modules())
    assert set(FAMILY_TEXT) <= set(modules)
    for path, names in FAMILY_NAMES.items():
        used = {t.string for t in tokenize.generate_tokens(io.StringIO(modules[path]).readline)}
        assert names <= used, f"{path}: {sorted(names - used)} no longer used"


def test_the_checks_catch_onnxruntime_spelled_ort() -> None:
    source = (
        "import onnxruntime as ort\n"
        "def create_ort_decoder(): return ort.GraphOptimizationLevel.ORT_ENABLE_ALL\n"
        "class OrtRuntime: pass\n"
        "ORT_TYPES = {}\n"
        "_RENAMED = {'ort': 'onnxruntime'}\n"
        "options = {'simplify': 'ort', 'policy': 'ort-default'}\n"
    )
    names = [name for _, name in _ort_identifiers(source, set())]
    assert names == ["ort", "create_ort_decoder", "ort", "OrtRuntime", "ORT_TYPES"]
    assert [text for _, text in _ort_values(source)] == ["ort", "ort-default"]
    assert _ort_identifiers("from edgecap.workshop.models import ort\n", {"ort"}) == []
