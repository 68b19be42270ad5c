"""Loading a `bench/` script as a module in tests (the benches are scripts, not a package).

Owns: `load_bench(script, as_name)`; each caller passes its own module name, so two test
modules that load the same script get separate copies and never share state.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load_bench(script: str, as_name: str) -> ModuleType:
    """Execute `bench/<script>` as module `as_name` (registered in `sys.modules`, so its
    dataclasses resolve their module) and return it."""
    spec = importlib.util.spec_from_file_location(as_name, BENCH / script)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
