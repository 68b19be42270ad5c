"""The app registry: name -> `AppSpec`, the one place applications are listed.

Owns: `register`, `get`, `names`, `specs`, `UnknownApp`, `DEFAULT_APP`. The built-in apps
(`phalanx.appspec.builtin`: ``kv``, ``chain``) are registered on first use; a plug-in
registers its spec by importing this module and calling `register`.

Invariants: a name maps to one spec for the life of the process (a different spec under a
taken name raises); `names()` is sorted (stable `--app` choices and messages). Importing
this module loads no app.
"""

from __future__ import annotations

from collections.abc import Iterator

from phalanx._spec_table import SpecTable
from phalanx.appspec.spec import AppSpec

DEFAULT_APP = "kv"
"""What a node config without ``app`` runs, and what `cluster init` and the harness use."""

_TABLE: SpecTable[AppSpec] = SpecTable("app", builtin="phalanx.appspec.builtin")


class UnknownApp(ValueError):
    """An app name nobody registered."""

    def __init__(self, name: str, why: str | None = None) -> None:
        super().__init__(why or f"unknown app {name!r}; registered: {', '.join(names())} (or "
                         "your own state machine: MODULE:FACTORY or FILE.py:FACTORY)")
        self.name = name


def register(spec: AppSpec) -> AppSpec:
    """Add `spec` (idempotent for the same spec). Raises ValueError on a name clash."""
    return _TABLE.add(spec)


def get(name: str) -> AppSpec:
    """The spec registered as `name`, or for ``MODULE:FACTORY`` / ``FILE.py:FACTORY`` the
    spec of that state machine (`phalanx.appspec.custom`; raises `AppConfigError` when it
    will not load). Raises `UnknownApp` naming the registered ones."""
    spec = _TABLE.lookup(name)
    if spec is not None:
        return spec
    if ":" in name:
        from phalanx.appspec.custom import custom_spec
        from phalanx.appspec.spec import AppConfigError

        if name not in _CUSTOM:
            try:
                _CUSTOM[name] = custom_spec(name)
            except AppConfigError as e:
                raise UnknownApp(name, str(e)) from None
        return _CUSTOM[name]
    raise UnknownApp(name)


_CUSTOM: dict[str, AppSpec] = {}
"""Custom apps already checked, by reference (a node builds its machine once per start)."""


def names() -> tuple[str, ...]:
    """Every registered app name, sorted (the `--app` choices)."""
    return _TABLE.loaded_names()


def specs() -> Iterator[AppSpec]:
    return (get(name) for name in names())
