"""The node-service registry: name -> `ServiceSpec`, the one place services are listed.

Owns: `register`, `get`, `names`, `specs`, `UnknownService`. The built-in services
(`phalanx.services.builtin`: ``gossip``) are registered on first use; a plug-in registers
its spec by importing this module and calling `register`.

Invariants: a name maps to one spec for the life of the process (a different spec under a
taken name raises); `names()` is sorted. Importing this module loads no service.
"""

from __future__ import annotations

from collections.abc import Iterator

from phalanx._spec_table import SpecTable
from phalanx.services.spec import ServiceSpec

_TABLE: SpecTable[ServiceSpec] = SpecTable("service", builtin="phalanx.services.builtin")


class UnknownService(ValueError):
    """A service name nobody registered."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown service {name!r}; registered: {', '.join(names())}")
        self.name = name


def register(spec: ServiceSpec) -> ServiceSpec:
    """Add `spec` (idempotent for the same spec). Raises ValueError on a name clash."""
    return _TABLE.add(spec)


def get(name: str) -> ServiceSpec:
    """The spec registered as `name`. Raises `UnknownService` naming the registered ones."""
    spec = _TABLE.lookup(name)
    if spec is None:
        raise UnknownService(name)
    return spec


def names() -> tuple[str, ...]:
    """Every registered service name, sorted."""
    return _TABLE.loaded_names()


def specs() -> Iterator[ServiceSpec]:
    return (get(name) for name in names())
