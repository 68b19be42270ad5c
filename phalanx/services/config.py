"""Node services in a node config: reading and writing their TOML tables.

Owns: `read_service_tables` (the config loader calls it: one table per registered service,
named as the service, e.g. ``[gossip]``; keys validated against `ServiceSpec.options`,
defaults filled in, unknown keys refused by the loader's strict check), `enabled_services`,
`needs_signing_keys` and `service_tables_for_toml` (what
`phalanx.ops.config_toml.node_config_dict` writes).

A service is off unless its table is present and ``enabled`` (when the spec has that
option) is true. Must not import: trio, the runtime, any service's machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from phalanx.services.registry import get, specs
from phalanx.services.spec import OptionValue

ServiceTables = Mapping[str, Mapping[str, OptionValue]]
"""Service name -> its validated options (every option present)."""


class _TableLike(Protocol):
    """The part of `phalanx.ops.node_config`'s strict table reader used here."""

    def has(self, key: str) -> bool: ...

    def table(self, key: str) -> Any: ...


def read_service_tables(root: _TableLike) -> dict[str, dict[str, OptionValue]]:
    """Every registered service's table present in `root`, validated (`ConfigError` names
    the file and the key)."""
    out: dict[str, dict[str, OptionValue]] = {}
    for spec in specs():
        if not root.has(spec.name):
            continue
        table = root.table(spec.name)
        values: dict[str, OptionValue] = {}
        for option in spec.options:
            default = option.default
            if isinstance(default, bool):
                values[option.name] = table.boolean(option.name, default)
            elif isinstance(default, int):
                values[option.name] = table.integer(option.name, default,
                                                    minimum=option.minimum)
            else:
                values[option.name] = table.text(option.name, default)
        out[spec.name] = values
    return out


def enabled_services(tables: ServiceTables) -> tuple[str, ...]:
    """The services a node with these tables runs, sorted."""
    return tuple(sorted(name for name, options in tables.items()
                        if options.get("enabled", True) is not False))


def needs_signing_keys(tables: ServiceTables) -> bool:
    """Whether an enabled service needs every node's signing key."""
    return any(get(name).signing_keys for name in enabled_services(tables))


def service_tables_for_toml(tables: ServiceTables) -> dict[str, dict[str, OptionValue]]:
    """The tables to write: every option, so an operator sees what can be tuned."""
    return {name: dict(tables[name]) for name in sorted(tables)}
