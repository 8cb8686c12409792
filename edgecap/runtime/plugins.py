"""Runtimes, INT8 presets and torch hooks from installed distributions, found through ``importlib.metadata`` entry
points.

edgecap's own workshop half is such a plugin: its ``pyproject.toml`` registers the torch runtimes (``torch``,
``torch-rerun``) in ``edgecap.runtimes`` and the torch hooks (:mod:`edgecap.runtime.torch_hooks`) in
``edgecap.torch_hooks``, so the runtime half never names a workshop module. edgecap's own entry points load first
and count as built-ins: a third-party plugin taking one of their names is the error below, never a silent swap.

A plugin distribution declares, in its ``pyproject.toml``::

    [project.entry-points."edgecap.runtimes"]
    my-runtime = "my_plugin:RUNTIME"        # a RuntimeSpec, or a callable that registers one (or returns it)

    [project.entry-points."edgecap.int8_presets"]
    my-preset = "my_plugin:PRESET"          # a QuantPreset, or a callable that registers one (or returns it)

so installing it is all a user does: no ``sitecustomize``, no import in their code. Each registry loads its group
once, when it is first queried (never at ``import edgecap``, which keeps start-up free of the metadata scan). A plugin
that fails to import or load is skipped with a :class:`PluginWarning` naming its distribution and entry point, so one
broken package never takes the built-in runtimes down with it; a plugin that registers a name already taken (a
built-in, or another plugin's) is a :class:`PluginError`, since silently replacing a built-in would change what
existing code runs.

Standard library only: the runtime install imports this module.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = [
    "INT8_PRESET_GROUP",
    "OWN_DISTRIBUTION",
    "RUNTIME_GROUP",
    "TORCH_HOOK_GROUP",
    "PluginError",
    "PluginLoader",
    "PluginWarning",
    "claim_names",
    "clash_error",
    "current_plugin",
]

#: The entry-point group of third-party runtimes (a ``RuntimeSpec`` or a callable registering one).
RUNTIME_GROUP = "edgecap.runtimes"
#: The entry-point group of third-party INT8 presets (a ``QuantPreset`` or a callable registering one).
INT8_PRESET_GROUP = "edgecap.int8_presets"
#: The entry-point group of the torch hooks (a ``TorchHook`` or a callable registering them): edgecap's workshop half.
TORCH_HOOK_GROUP = "edgecap.torch_hooks"
#: The distribution whose entry points are edgecap's own (loaded first, as built-ins).
OWN_DISTRIBUTION = "edgecap"


class PluginWarning(UserWarning):
    """A plugin could not be loaded and was skipped."""


class PluginError(ValueError):
    """A plugin registers a name that is already taken (a built-in or another plugin's)."""


_local = threading.local()


def current_plugin() -> str | None:
    """The plugin being loaded on this thread (``"entry point 'x' of distribution 'y'"``), None outside plugin
    loading: registries refuse to let a plugin replace a name that is already registered."""
    return getattr(_local, "plugin", None)


@contextmanager
def _loading(label: str | None) -> Iterator[None]:
    previous = current_plugin()
    _local.plugin = label
    try:
        yield
    finally:
        _local.plugin = previous


def _dist_name(entry_point: Any) -> str | None:
    return getattr(getattr(entry_point, "dist", None), "name", None)


def _label(entry_point: Any) -> str:
    dist_name = _dist_name(entry_point) or "<unknown distribution>"
    return f"entry point {entry_point.name!r} ({entry_point.value}) of distribution {dist_name!r}"


def _is_own(entry_point: Any) -> bool:
    return (_dist_name(entry_point) or "").lower() == OWN_DISTRIBUTION


class PluginLoader:
    """Loads one entry-point group into one registry, once, on first use (thread-safe).

    Args:
        group: the entry-point group (:data:`RUNTIME_GROUP`, :data:`INT8_PRESET_GROUP`).
        kind: the spec class an entry point may resolve to (or a callable may return).
        register: the registry's register function, called with each spec.

    Attributes:
        loaded: the group has been read (its plugins registered, skipped or refused).
        own_found: the group had an entry point of edgecap's own distribution (False: edgecap's installed metadata
            lacks them, e.g. a source tree used without ``pip install -e .``, so the workshop half is not plugged in).
    """

    def __init__(self, group: str, kind: type, register: Callable[[Any], Any]) -> None:
        self.group = group
        self.kind = kind
        self.register = register
        self._lock = threading.RLock()
        self._loading = False
        self.loaded = False
        self.own_found = False
        self._errors: list[PluginError] = []

    def ensure_loaded(self) -> None:
        """Load the group's plugins the first time this is called; raise any name clash, every time.

        Another thread's query waits until loading ends; a plugin that queries its own registry while it loads (the
        same thread) sees what is registered so far instead of recursing.
        """
        if not self.loaded:
            with self._lock:
                if not self.loaded and not self._loading:
                    self._loading = True
                    try:
                        self._errors = self._load_all()
                    finally:
                        self._loading = False
                        self.loaded = True
        if self._errors:
            raise self._errors[0]

    def _load_all(self) -> list[PluginError]:
        from importlib.metadata import entry_points

        try:
            found = list(entry_points(group=self.group))
        except Exception as exc:  # unreadable metadata of some installed distribution
            warnings.warn(f"edgecap could not read the {self.group} entry points: {exc}", PluginWarning, stacklevel=2)
            return []
        errors: list[PluginError] = []
        # edgecap's own first, as built-ins (no plugin label): a third-party clash then names the third party
        found.sort(key=lambda entry_point: not _is_own(entry_point))
        self.own_found = any(map(_is_own, found))
        for entry_point in found:
            label = _label(entry_point)
            try:
                with _loading(None if _is_own(entry_point) else label):
                    self._load_one(entry_point, label)
            except PluginError as exc:
                errors.append(exc)
            except Exception as exc:  # a plugin's own bug must not break the built-ins
                warnings.warn(
                    f"edgecap skipped the {self.group} plugin {label}: {type(exc).__name__}: {exc}",
                    PluginWarning,
                    stacklevel=2,
                )
        return errors

    def _load_one(self, entry_point: Any, label: str) -> None:
        target = entry_point.load()
        if isinstance(target, self.kind):
            self.register(target)
            return
        if not callable(target):
            raise TypeError(f"it resolves to a {type(target).__name__}, neither a {self.kind.__name__} nor a callable")
        result = target()
        if isinstance(result, self.kind):
            self.register(result)
        elif result is not None:
            raise TypeError(f"it returned a {type(result).__name__}, neither a {self.kind.__name__} nor None")


def claim_names(kind: str, names: Sequence[str], holder: Callable[[str], str | None], owners: dict[str, str]) -> None:
    """While an entry-point plugin loads (:func:`current_plugin`): refuse any of ``names`` that is already taken, then
    record the plugin as their owner. Outside plugin loading nothing is checked (a direct ``register_*`` call may
    replace a name, as it always could).

    Args:
        kind: what the names name (``"runtime"``, ``"INT8 preset"``), for the message.
        names: the names the plugin registers.
        holder: a name -> the registered name it is taken under, or None when it is free.
        owners: registered name -> the plugin that registered it (edgecap's own are absent); updated here.

    Raises:
        PluginError: a name is taken; the message names the built-in or the plugin that holds it.
    """
    plugin = current_plugin()
    if plugin is None:
        return
    for name in names:
        taken = holder(name)
        if taken is not None:
            raise clash_error(kind, name, plugin, owners.get(taken))
    owners.update(dict.fromkeys(names, plugin))


def clash_error(kind: str, name: str, plugin: str, owner: str | None) -> PluginError:
    """The error of ``plugin`` registering the ``kind`` ``name`` that ``owner`` (a plugin label, None: edgecap
    itself) already registered."""
    taken = f"the built-in {kind} {name!r}" if owner is None else f"{kind} {name!r}, already registered by {owner}"
    return PluginError(
        f"the {kind} plugin {plugin} registers {name!r}, which clashes with {taken}; the plugin must choose another "
        "name (uninstall its distribution to use edgecap meanwhile)"
    )
