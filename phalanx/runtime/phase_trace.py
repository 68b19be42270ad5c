"""Per-phase latency tracing of one node (a debugging aid; off unless asked for).

Owns: `PhaseTrace` (an append-only file of `<monotonic ns> <event> <detail>` lines, one per
node) and `phase_trace_from_env` (`PHALANX_TRACE_PHASES=DIR` turns it on: each node writes
`DIR/<node id>.trace`). `bench/latency_trace.py` runs a cluster with it, drives one
closed-loop client and lines the events of every node up against each request.

Events the driver marks: ``call`` (a client call reached the core task), ``recv`` (a peer
message, detail = its type), ``io_start``/``io_end`` (a persistence batch handed to / back
from the worker thread; ``io_inline`` for one persisted on the core task;
``yield_for_output`` when an inline write first lets writer tasks run), ``send`` (a
message handed to the transport, detail = its type), ``apply`` (committed entries applied)
and ``reply`` (an answer handed to a client connection).

Must not import: trio, sockets, any consensus core. The clock is `time.monotonic_ns`, which
on Linux is one system-wide clock, so the files of several processes on one machine line
up. Zero cost when off: the driver holds None and tests `is not None` before each mark.
Tracing is never used by the simulator (it reads a clock).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TextIO

ENV_VAR = "PHALANX_TRACE_PHASES"


class PhaseTrace:
    """Appends phase events to `path` (line-buffered: a killed node loses at most a line)."""

    __slots__ = ("_clock", "_file")

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = path.open("a", buffering=1, encoding="utf-8")
        self._clock = time.monotonic_ns

    def mark(self, event: str, detail: str = "") -> None:
        self._file.write(f"{self._clock()} {event} {detail}\n")

    def close(self) -> None:
        self._file.close()


def phase_trace_from_env(node_id: str) -> PhaseTrace | None:
    """A `PhaseTrace` for `node_id` when `PHALANX_TRACE_PHASES` names a directory."""
    directory = os.environ.get(ENV_VAR)
    if not directory:
        return None
    return PhaseTrace(Path(directory) / f"{node_id}.trace")
