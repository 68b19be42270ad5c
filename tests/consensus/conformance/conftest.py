"""Makes the conformance helpers (`subjects`, `sim_cluster`, `wire_strategies`,
`ready_executor`) importable from the conformance tests and from the cores' own harnesses."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
