"""The embedding example runs end to end (3 in-process nodes, a leader change)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "counter_service.py"


def test_counter_service_example_runs() -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "took tickets [1, 2, 3] at the bakery" in done.stdout
    assert "took tickets [4, 5]" in done.stdout
    assert "the bakery is at ticket 5" in done.stdout
    assert "ok: tickets never repeat across a leader change" in done.stdout
