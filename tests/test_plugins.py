"""Runtimes and INT8 presets from installed plugins (``edgecap.runtimes`` / ``edgecap.int8_presets`` entry
points).

The plugin package of docs/extending.md is built from its ``plugin:`` blocks, installed for real with pip
(``--no-index``: nothing is downloaded) and queried in a fresh interpreter, with no edit to edgecap and no import of
the plugin. Broken and clashing plugins are hand-written ``.dist-info`` folders: ``importlib.metadata`` reads them
the same way it reads pip's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

import edgecap.workshop.export.calibration.presets as presets_module
from edgecap.runtime import plugins
from edgecap.runtime.backends import RuntimeSpec
from edgecap.runtime.backends import registry as runtimes_registry
from edgecap.workshop.export.calibration import QuantPreset, get_preset

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending.md"
PLUGIN_BLOCK = re.compile(r"<!-- plugin: (?P<path>[\w./]+) -->\n```\w+\n(?P<code>.*?)```", re.S)


def _dist_info(site: Path, name: str, entry_points: str, modules: dict[str, str] | None = None) -> None:
    """A minimal installed distribution: what ``importlib.metadata`` reads to find entry points."""
    info = site / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    for module, code in (modules or {}).items():
        (site / f"{module}.py").write_text(textwrap.dedent(code))


def _run(code: str, *sites: Path) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter with ``sites`` on its path; it prints one JSON line last."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, sites), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """docs/extending.md's plugin package, pip-installed into a ``--target`` folder, plus a broken plugin."""
    root = tmp_path_factory.mktemp("plugins")
    package = root / "edgecap-cpu1"
    blocks = PLUGIN_BLOCK.findall(DOC.read_text())
    assert [path for path, _ in blocks] == [
        "pyproject.toml",
        "edgecap_cpu1/__init__.py",
        "edgecap_cpu1/runtime.py",
        "edgecap_cpu1/int8.py",
    ]
    for path, code in blocks:
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).write_text(code)
    site = root / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "--quiet"]
    done = subprocess.run(
        [*pip, "--target", str(site), str(package)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert list(site.glob("edgecap_cpu1-0.1.0.dist-info"))
    _dist_info(
        site,
        "edgecap-broken",
        """\
        [edgecap.runtimes]
        broken-runtime = edgecap_broken:RUNTIME
        [edgecap.int8_presets]
        not-a-preset = edgecap_broken_data:NAME
        """,
        {
            "edgecap_broken": "raise RuntimeError('the broken plugin fails at import')\n",
            "edgecap_broken_data": "NAME = 'a string, not a preset'\n",
        },
    )
    return site


def test_an_installed_plugin_registers_its_runtime_and_preset_when_first_queried(plugin_site: Path) -> None:
    found = _run(
        """
        import json, sys, warnings

        import edgecap, edgecap.workshop.export.calibration, edgecap.runtime.backends
        imported_at_start = sorted(m for m in sys.modules if m.startswith(("edgecap_cpu1", "edgecap_broken")))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from edgecap.runtime.backends import get_runtime, list_runtimes
            from edgecap.workshop.export.calibration import get_preset, list_presets

            runtimes, presets = list_runtimes(), list_presets()
            list_runtimes(), list_presets()  # loaded once: no second warning
            spec = get_runtime("onnxruntime-cpu1")
            loader = spec.load_function()
        print(json.dumps({
            "imported_at_start": imported_at_start,
            "runtimes": runtimes,
            "presets": presets,
            "loader": f"{loader.__module__}:{loader.__name__}",
            "graph_runtime": spec.graph_runtime_class().__name__,
            "per_channel": get_preset("cpu-avx2-tensorwise").per_channel,
            "reduce_range": get_preset("cpu-avx2-tensorwise").reduce_range,
            "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
        }))
        """,
        plugin_site,
    )
    assert found["imported_at_start"] == []  # nothing of a plugin at import edgecap
    assert found["runtimes"][:2] == ["onnxruntime", "torch"] and "onnxruntime-cpu1" in found["runtimes"]
    assert "cpu-avx2-tensorwise" in found["presets"] and "tensorrt" in found["presets"]
    assert found["loader"] == "edgecap_cpu1.runtime:load_bundle_runtime"
    assert found["graph_runtime"] == "OnnxRuntimeSession"
    assert found["per_channel"] is False and found["reduce_range"] is True
    plugin_warnings = [w for w in found["warnings"] if w.startswith("PluginWarning")]
    assert len(plugin_warnings) == 2, found["warnings"]
    broken_runtime = next(w for w in plugin_warnings if "broken-runtime" in w)
    assert "'edgecap-broken'" in broken_runtime and "the broken plugin fails at import" in broken_runtime
    not_a_preset = next(w for w in plugin_warnings if "not-a-preset" in w)
    assert "'edgecap-broken'" in not_a_preset and "neither a QuantPreset nor a callable" in not_a_preset


def test_a_plugin_that_takes_a_built_in_name_is_an_error_naming_it(plugin_site: Path, tmp_path: Path) -> None:
    clash = tmp_path / "clash"
    _dist_info(
        clash,
        "edgecap-clash",
        """\
        [edgecap.runtimes]
        fake-onnxruntime = edgecap_clash:RUNTIME
        [edgecap.int8_presets]
        fake-tensorrt = edgecap_clash:preset
        """,
        {
            "edgecap_clash": """\
            from edgecap.workshop.export.calibration import get_preset
            from edgecap.runtime.backends import RuntimeSpec

            RUNTIME = RuntimeSpec(name="onnxruntime", description="not onnxruntime", loader="edgecap_clash:x")

            def preset():
                return get_preset("cpu-avx2").replace(name="tensorrt")
            """
        },
    )
    found = _run(
        """
        import json
        from edgecap.workshop.export.calibration import list_presets
        from edgecap.runtime.plugins import PluginError
        from edgecap.runtime.backends import get_runtime, list_runtimes

        errors = []
        for query in (list_runtimes, list_runtimes, lambda: get_runtime("torch"), list_presets):
            try:
                query()
                errors.append(None)
            except PluginError as exc:
                errors.append(str(exc))
        print(json.dumps({"errors": errors}))
        """,
        plugin_site,
        clash,
    )
    runtime_error, again, other_query, preset_error = found["errors"]
    assert runtime_error and runtime_error == again == other_query  # every query, not only the first
    assert "'fake-onnxruntime'" in runtime_error and "'edgecap-clash'" in runtime_error
    assert "the built-in runtime 'onnxruntime'" in runtime_error
    assert preset_error and "the built-in INT8 preset 'tensorrt'" in preset_error and "'fake-tensorrt'" in preset_error


class _EntryPoint:
    """What the loader reads of an ``importlib.metadata.EntryPoint``."""

    def __init__(self, name: str, target: Any, dist: str = "edgecap-fake") -> None:
        self.name, self.value, self._target = name, f"fake:{name}", target
        self.dist = type("Dist", (), {"name": dist})()

    def load(self) -> Any:
        return self._target


@pytest.fixture
def fresh_registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Private copies of both registries, so registrations here never leak into other tests (edgecap's own plugins
    loaded first, into the real registry)."""
    runtimes_registry.load_runtime_plugins()
    for module, names in (
        (runtimes_registry, ("_REGISTRY", "_ALIASES", "_PLUGIN_NAMES")),
        (presets_module, ("_PRESETS", "_PLUGIN_NAMES")),
    ):
        for name in names:
            monkeypatch.setattr(module, name, dict(getattr(module, name)))


def _entry_points(monkeypatch: pytest.MonkeyPatch, groups: dict[str, list[_EntryPoint]]) -> list[str]:
    calls: list[str] = []

    def entry_points(*, group: str) -> list[_EntryPoint]:
        calls.append(group)
        return groups.get(group, [])

    monkeypatch.setattr("importlib.metadata.entry_points", entry_points)
    return calls


def test_entry_points_are_read_once_and_a_callable_may_return_or_register(
    fresh_registries: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = RuntimeSpec(name="returned", description="d", loader="m:f")

    def registers() -> None:
        runtimes_registry.register_runtime(RuntimeSpec(name="registered", description="d", loader="m:f"))

    calls = _entry_points(
        monkeypatch, {plugins.RUNTIME_GROUP: [_EntryPoint("a", lambda: spec), _EntryPoint("b", registers)]}
    )
    loader = plugins.PluginLoader(plugins.RUNTIME_GROUP, RuntimeSpec, runtimes_registry.register_runtime)
    loader.ensure_loaded()
    loader.ensure_loaded()
    assert calls == [plugins.RUNTIME_GROUP]
    assert runtimes_registry._REGISTRY["returned"] is spec and "registered" in runtimes_registry._REGISTRY
    assert runtimes_registry._PLUGIN_NAMES["returned"].startswith("entry point 'a' (fake:a) of distribution")
    # outside plugin loading, registering a taken name still replaces it, as before
    runtimes_registry.register_runtime(RuntimeSpec(name="torch", description="mine", loader="m:f"))
    assert runtimes_registry._REGISTRY["torch"].description == "mine"


def test_a_plugin_clashing_with_another_plugin_names_both(
    fresh_registries: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    preset = get_preset("cpu-vnni").replace(name="npu")
    _entry_points(
        monkeypatch,
        {
            plugins.INT8_PRESET_GROUP: [
                _EntryPoint("first", preset, "dist-one"),
                _EntryPoint("second", preset, "dist-two"),
            ]
        },
    )
    loader = plugins.PluginLoader(plugins.INT8_PRESET_GROUP, QuantPreset, presets_module.register_preset)
    with pytest.raises(plugins.PluginError, match=r"'dist-two'.*already registered by entry point 'first'.*'dist-one'"):
        loader.ensure_loaded()
    assert presets_module._PRESETS["npu"] is preset


def test_the_registries_load_their_plugins_on_query_not_at_import() -> None:
    found = _run(
        """
        import json
        import edgecap, edgecap.workshop.export.calibration, edgecap.runtime.backends
        from edgecap.workshop.export.calibration.presets import _PLUGINS as presets
        from edgecap.runtime.backends.registry import _PLUGINS as runtimes

        before = [runtimes.loaded, presets.loaded]
        edgecap.runtime.backends.list_runtimes()
        print(json.dumps({"before": before, "after": [runtimes.loaded, presets.loaded]}))
        """
    )
    assert found == {"before": [False, False], "after": [True, False]}


def test_a_query_from_another_thread_waits_for_the_plugins(
    fresh_registries: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    started, release = threading.Event(), threading.Event()

    def slow() -> RuntimeSpec:
        started.set()
        release.wait(10)
        return RuntimeSpec(name="slow", description="d", loader="m:f")

    _entry_points(monkeypatch, {plugins.RUNTIME_GROUP: [_EntryPoint("slow", slow)]})
    monkeypatch.setattr(
        runtimes_registry,
        "_PLUGINS",
        plugins.PluginLoader(plugins.RUNTIME_GROUP, RuntimeSpec, runtimes_registry.register_runtime),
    )
    first = threading.Thread(target=runtimes_registry.list_runtimes)
    first.start()
    assert started.wait(10)
    seen: list[list[str]] = []
    second = threading.Thread(target=lambda: seen.append(runtimes_registry.list_runtimes()))
    second.start()
    second.join(0.2)
    assert second.is_alive()  # waiting for the first thread's loading, not answering without the plugin
    release.set()
    first.join(10)
    second.join(10)
    assert "slow" in seen[0]


def test_edgecaps_own_entry_points_load_first_as_built_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workshop half's torch runtimes are a plugin, yet a third-party plugin listed before it that takes
    ``torch`` is the one refused, by the name of a built-in: never a silent swap of what ``runtime="torch"`` runs."""
    for name in ("_REGISTRY", "_ALIASES", "_PLUGIN_NAMES"):
        monkeypatch.setattr(runtimes_registry, name, {})
    own = RuntimeSpec(name="torch", description="edgecap's", loader="m:f")
    other = RuntimeSpec(name="torch", description="a third party's", loader="m:f")
    _entry_points(
        monkeypatch,
        {plugins.RUNTIME_GROUP: [_EntryPoint("their-torch", other, "edgecap-other"), _EntryPoint("t", own, "edgecap")]},
    )
    loader = plugins.PluginLoader(plugins.RUNTIME_GROUP, RuntimeSpec, runtimes_registry.register_runtime)
    with pytest.raises(plugins.PluginError, match=r"'edgecap-other'.*clashes with the built-in runtime 'torch'"):
        loader.ensure_loaded()
    assert runtimes_registry._REGISTRY["torch"] is own and "torch" not in runtimes_registry._PLUGIN_NAMES
    assert loader.own_found


def test_without_edgecaps_own_entry_points_the_torch_runtimes_say_to_reinstall(monkeypatch: pytest.MonkeyPatch) -> None:
    """A source tree used without ``pip install -e .`` (or metadata from before the plugins): ``torch`` is unknown,
    and the error says why instead of only listing the registered runtimes."""
    for name in ("_REGISTRY", "_ALIASES", "_PLUGIN_NAMES"):
        monkeypatch.setattr(runtimes_registry, name, dict(getattr(runtimes_registry, name)))
    runtimes_registry._REGISTRY.pop("torch", None)
    _entry_points(monkeypatch, {})
    loader = plugins.PluginLoader(plugins.RUNTIME_GROUP, RuntimeSpec, runtimes_registry.register_runtime)
    monkeypatch.setattr(runtimes_registry, "_PLUGINS", loader)
    with pytest.raises(
        runtimes_registry.UnknownRuntimeError, match=r"metadata lacks its entry points.*edgecap\[train\]"
    ):
        runtimes_registry.get_runtime("torch")
    assert not loader.own_found
