"""The torch hooks: the four places the runtime reaches torch, registered by the workshop half through entry points."""

from __future__ import annotations

import pytest

from edgecap.runtime import plugins, torch_hooks
from edgecap.runtime.torch_hooks import HOOK_NAMES, TorchHook, TorchUnavailableError, register_torch_hook, torch_hook


class _EntryPoint:
    def __init__(self, name: str, target: object, dist: str) -> None:
        self.name, self.value, self._target = name, f"fake:{name}", target
        self.dist = type("Dist", (), {"name": dist})()

    def load(self) -> object:
        return self._target


class _Plugins:
    """A private hook registry and the entry points its loader will read."""

    def __init__(self) -> None:
        self.registry: dict[str, TorchHook] = {}
        self.entry_points: list[_EntryPoint] = []

    def add(self, name: str, target: object, dist: str) -> None:
        self.entry_points.append(_EntryPoint(name, target, dist))


@pytest.fixture
def hooks(monkeypatch: pytest.MonkeyPatch) -> _Plugins:
    """An empty private registry, loaded from the fixture's entry points on the first query, with torch "present"."""
    fake = _Plugins()
    monkeypatch.setattr(torch_hooks, "_HOOKS", fake.registry)
    monkeypatch.setattr(torch_hooks, "_PLUGIN_NAMES", {})
    loader = plugins.PluginLoader(plugins.TORCH_HOOK_GROUP, TorchHook, register_torch_hook)
    monkeypatch.setattr(torch_hooks, "_PLUGINS", loader)

    def entry_points(*, group: str) -> list[_EntryPoint]:
        return fake.entry_points if group == plugins.TORCH_HOOK_GROUP else []

    monkeypatch.setattr("importlib.metadata.entry_points", entry_points)
    monkeypatch.setattr(torch_hooks, "torch_available", lambda: True)
    return fake


def test_a_hook_is_imported_from_its_registration_on_first_use(hooks: _Plugins) -> None:
    hooks.add("torch", lambda: register_torch_hook(TorchHook("torch_arrays", "json:dumps")), "edgecap")
    import json

    assert torch_hook("torch_arrays") is json.dumps
    assert set(hooks.registry) == {"torch_arrays"}


def test_a_hook_nobody_registered_says_to_install_the_training_stack(hooks: _Plugins) -> None:
    with pytest.raises(TorchUnavailableError, match=r"captioner_from_run needs the training stack.*reinstall it"):
        torch_hook("captioner_from_run")
    with pytest.raises(KeyError, match="unknown torch hook"):
        torch_hook("no_such_hook")


def test_without_torch_no_plugin_is_read(hooks: _Plugins, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_hooks, "torch_available", lambda: False)
    with pytest.raises(TorchUnavailableError, match=r"runs in torch, which is not installed here.*edgecap\[train\]"):
        torch_hook("backbone_inputs")
    assert not torch_hooks._PLUGINS.loaded


def test_a_target_that_does_not_import_is_one_clear_error(hooks: _Plugins) -> None:
    hooks.add("torch", TorchHook("backbone_inputs", "edgecap_no_such_module:f"), "edgecap")
    hooks.add("more", TorchHook("torch_arrays", "json:no_such_attribute"), "edgecap")
    with pytest.raises(TorchUnavailableError, match="edgecap_no_such_module, which failed to import"):
        torch_hook("backbone_inputs")
    with pytest.raises(TorchUnavailableError, match="json has no 'no_such_attribute'"):
        torch_hook("torch_arrays")


def test_a_third_party_plugin_cannot_replace_a_built_in_hook(hooks: _Plugins) -> None:
    hooks.add("mine", TorchHook("torch_arrays", "json:loads"), "edgecap-other")
    hooks.add("torch", TorchHook("torch_arrays", "json:dumps"), "edgecap")
    with pytest.raises(plugins.PluginError, match="'edgecap-other'.*the built-in torch hook 'torch_arrays'"):
        torch_hook("torch_arrays")
    assert hooks.registry["torch_arrays"].target == "json:dumps"


def test_hooks_are_checked_when_registered() -> None:
    with pytest.raises(ValueError, match="unknown torch hook 'nope'"):
        TorchHook("nope", "a.b:c")
    with pytest.raises(ValueError, match="package.module:attr"):
        TorchHook("torch_arrays", "no_colon")
    with pytest.raises(TypeError, match="TorchHook"):
        register_torch_hook("torch_arrays")  # type: ignore[arg-type]
    assert len(HOOK_NAMES) == 4
