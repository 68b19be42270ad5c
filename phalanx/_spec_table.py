"""The name -> spec table both registries keep (`phalanx.protocols.registry`,
`phalanx.appspec.registry`): one rule for names and clashes.

Owns: `SpecTable`. Invariants: a name maps to one spec for the life of the process
(a different spec under a taken name raises ValueError); names are letters, digits, '-' and
'_'; `names()` is sorted.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar


class _Named(Protocol):
    @property
    def name(self) -> str: ...


S = TypeVar("S", bound=_Named)


class SpecTable(Generic[S]):
    """Specs by name; `kind` ("protocol", "app") words the errors."""

    __slots__ = ("kind", "specs")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.specs: dict[str, S] = {}

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
