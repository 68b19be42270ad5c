"""Lazily loaded package attributes (PEP 562): `lazy_attributes`.

A package lists ``{attribute: module}`` and gets a module-level ``__getattr__`` that imports
the module on first access and caches the value in the package, so importing the package
stays cheap (no trio, TLS or core until a name is used).
"""

from __future__ import annotations

import importlib

# `typing.TYPE_CHECKING` without importing `typing` (type checkers read the name as True):
# `import phalanx` costs the interpreter's start-up and this package, nothing more.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any


def lazy_attributes(package: str, table: Mapping[str, str],
                    namespace: dict[str, Any]) -> Callable[[str], object]:
    """The ``__getattr__`` of `package` for the names in `table` (cached in `namespace`)."""

    def __getattr__(name: str) -> object:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value: object = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
