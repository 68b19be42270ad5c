"""The name -> spec table every registry keeps (`phalanx.protocols.registry`,
`phalanx.appspec.registry`, `phalanx.services.registry`): one rule for names and clashes,
and the built-in specs loaded on first lookup.

Owns: `SpecTable`. Invariants: a name maps to one spec for the life of the process
(a different spec under a taken name raises ValueError); names are letters, digits, '-' and
'_'; `names()` is sorted; the built-in module (its ``SPECS``) is imported once, at the
first `lookup` or `loaded_names`, never at construction.
"""

from __future__ import annotations

import importlib
from typing import Generic, Protocol, TypeVar


class _Named(Protocol):
    @property
    def name(self) -> str: ...


S = TypeVar("S", bound=_Named)


class SpecTable(Generic[S]):
    """Specs by name; `kind` ("protocol", "app", "service") words the errors; `builtin`
    names the module whose ``SPECS`` are registered on first lookup."""

    __slots__ = ("_builtin", "kind", "specs")

    def __init__(self, kind: str, *, builtin: str | None = None) -> None:
        self.kind = kind
        self.specs: dict[str, S] = {}
        self._builtin = builtin

    def load_builtin(self) -> None:
        """Register the built-in module's ``SPECS`` (once)."""
        if self._builtin is not None:
            module, self._builtin = self._builtin, None
            for spec in importlib.import_module(module).SPECS:
                self.add(spec)

    def lookup(self, name: str) -> S | None:
        """The spec registered as `name` (built-ins loaded first), or None."""
        self.load_builtin()
        return self.specs.get(name)

    def loaded_names(self) -> tuple[str, ...]:
        """`names()` after loading the built-ins."""
        self.load_builtin()
        return self.names()

    def add(self, spec: S) -> S:
        """Add `spec` (idempotent for the same spec). Raises ValueError on a name clash or a
        malformed name."""
        held = self.specs.get(spec.name)
        if held is not None and held != spec:
            raise ValueError(f"{self.kind} {spec.name!r} is already registered with another spec")
        if not spec.name or not spec.name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"{self.kind} name {spec.name!r}: use letters, digits, '-' and '_'")
        self.specs[spec.name] = spec
        return spec

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.specs))
