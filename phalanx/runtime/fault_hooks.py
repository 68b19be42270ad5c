"""Test-only hooks a node honours when ``PHALANX_TEST_HOOKS=1`` (never in production).

Owns: the clock-rate control file and `watch_clock_rate`, the task that applies it.

The Jepsen harness skews one node's tick source by writing ``{"clock_rate": r}`` atomically
to ``$PHALANX_TEST_CONTROL_DIR/<node id>.ctl`` (a file, not a signal, so a node that is
still starting cannot be killed by it; it outlives restarts, so a restarted node keeps its
skew). The node polls it and makes its driver tick every ``tick_seconds / r``: a node whose
clock runs fast (r > 1) times out elections early, a slow one (r < 1) late.

Rules: off unless both ``PHALANX_TEST_HOOKS=1`` and ``PHALANX_TEST_CONTROL_DIR`` are set. The
file is harness input, still parsed defensively: a missing, unreadable or malformed file, or
a rate outside [`MIN_RATE`, `MAX_RATE`], is ignored (and logged once per distinct problem).
Must not import consensus cores.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

import trio

HOOKS_ENV: Final = "PHALANX_TEST_HOOKS"
CONTROL_DIR_ENV: Final = "PHALANX_TEST_CONTROL_DIR"
MIN_RATE: Final = 0.05
MAX_RATE: Final = 20.0
POLL_SECONDS: Final = 0.2

logger = logging.getLogger(__name__)


def control_file(node_id: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """The node's control file, or None when the hooks are off."""
    env = os.environ if environ is None else environ
    directory = env.get(CONTROL_DIR_ENV)
    if env.get(HOOKS_ENV) != "1" or not directory:
        return None
    return Path(directory) / f"{node_id}.ctl"


def read_clock_rate(path: Path) -> float | str:
    """The file's clock rate, or a description of why there is none."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "no control file"
    except (OSError, ValueError) as exc:
        return f"unreadable control file: {exc}"
    rate = doc.get("clock_rate") if isinstance(doc, dict) else None
    if isinstance(rate, bool) or not isinstance(rate, int | float):
        return f"no numeric clock_rate in {doc!r}"
    if not MIN_RATE <= rate <= MAX_RATE:
        return f"clock_rate {rate} outside [{MIN_RATE}, {MAX_RATE}]"
    return float(rate)


async def watch_clock_rate(path: Path, apply: Callable[[float], None], *,
                           poll_seconds: float = POLL_SECONDS) -> None:
    """Poll `path` forever; call `apply(rate)` whenever the valid rate changes."""
    current = 1.0
    last_problem = ""
    while True:
        rate = read_clock_rate(path)
        if isinstance(rate, float):
            if rate != current:
                logger.warning("test hook: clock rate %g (was %g)", rate, current)
                apply(rate)
                current = rate
            last_problem = ""
        elif rate != last_problem and rate != "no control file":
            logger.warning("test hook: ignoring %s: %s", path, rate)
            last_problem = rate
        await trio.sleep(poll_seconds)
