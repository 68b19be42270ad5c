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

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown app {name!r}; registered: {', '.join(names())}")
        self.name = name


def register(spec: AppSpec) -> AppSpec:
    """Add `spec` (idempotent for the same spec). Raises ValueError on a name clash."""
    return _TABLE.add(spec)


def get(name: str) -> AppSpec:
    """The spec registered as `name`. Raises `UnknownApp` naming the registered ones."""
    spec = _TABLE.lookup(name)
    if spec is None:
        raise UnknownApp(name)
    return spec


def names() -> tuple[str, ...]:
    """Every registered app name, sorted (the `--app` choices)."""
    return _TABLE.loaded_names()


def specs() -> Iterator[AppSpec]:
    return (get(name) for name in names())
