"""The protocol registry: name -> `ProtocolSpec`, the one place protocols are listed.

Owns: `register`, `get`, `names`, `specs`, `UnknownProtocol`, and plugin loading. The
built-in protocols (`phalanx.protocols.builtin`) are registered on first use; more come from
plugins: modules named in the ``PHALANX_PROTOCOLS`` environment variable (comma-separated;
each registers its specs when imported) and the ``phalanx.protocols`` entry-point group of
installed distributions (each entry point names a `ProtocolSpec`).

Invariants: a name maps to one spec for the life of the process (registering a different
spec under a taken name raises); `names()` is sorted, so every `--protocol` choice list
and error message is stable. Importing this module loads no core.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator

from phalanx._spec_table import SpecTable
from phalanx.protocols.spec import ProtocolSpec

PLUGINS_ENV = "PHALANX_PROTOCOLS"
"""Comma-separated modules imported on first lookup; each calls `register`."""

ENTRY_POINT_GROUP = "phalanx.protocols"

DEFAULT_PROTOCOL = "raft"
"""What `cluster init`, the client, the simulator and the harness use unless told."""

_TABLE: SpecTable[ProtocolSpec] = SpecTable("protocol", builtin="phalanx.protocols.builtin")
_plugins_loaded = False


class UnknownProtocol(ValueError):
    """A protocol name nobody registered."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown protocol {name!r}; registered: {', '.join(names())}")
        self.name = name


def register(spec: ProtocolSpec) -> ProtocolSpec:
    """Add `spec` (idempotent for the same spec). Raises ValueError on a name clash."""
    return _TABLE.add(spec)


def _load_plugins() -> None:
    """Import the plugins (once; scanning entry points costs tens of ms, so a lookup of a
    built-in protocol does not)."""
    global _plugins_loaded
    _TABLE.load_builtin()
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for module in filter(None, (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(","))):
        importlib.import_module(module)
    from importlib.metadata import entry_points

    for point in entry_points(group=ENTRY_POINT_GROUP):
        register(point.load())


def get(name: str) -> ProtocolSpec:
    """The spec registered as `name`. Raises `UnknownProtocol` naming the registered ones."""
    spec = _TABLE.lookup(name)
    if spec is None:
        _load_plugins()
        spec = _TABLE.specs.get(name)
    if spec is None:
        raise UnknownProtocol(name)
    return spec


def names() -> tuple[str, ...]:
    """Every registered protocol name, sorted (the `--protocol` choices)."""
    _load_plugins()
    return _TABLE.names()


def specs() -> Iterator[ProtocolSpec]:
    """Every registered spec, by name."""
    return (get(name) for name in names())


def byzantine_mode_problem(spec: ProtocolSpec, mode: str) -> str | None:
    """Why `mode` is not a Byzantine mode of `spec` (one line naming what is), or None."""
    if mode in spec.byzantine_modes:
        return None
    if not spec.byzantine_modes:
        able = [s.name for s in specs() if s.byzantine_modes]
        return (f"{spec.name} has no Byzantine modes (they need a protocol that tolerates "
                f"Byzantine replicas: {', '.join(able) or 'none registered'})")
    return (f"unknown Byzantine mode {mode!r} for {spec.name}; choose from "
            f"{', '.join(spec.byzantine_modes)}")
