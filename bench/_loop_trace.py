"""A node process whose trio event loop is traced: every scheduler batch (the run between two
waits for I/O) that takes longer than `PHALANX_LOOP_TRACE_MS` (default 50) is logged with the
tasks that took the most time in it. Diagnoses event-loop starvation (a Raft leader whose
heartbeats leave late loses leadership) under `bench/attack_handshakes.py --trace-loop`.

Usage: _loop_trace.py CONFIG   (the same node as `phalanx node run CONFIG`, plus the trace)
Must not be imported by the package.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import defaultdict
from typing import Any

import trio

logger = logging.getLogger("loop_trace")


class BatchTrace(trio.abc.Instrument):
    """Times each batch and each task step within it."""

    def __init__(self, threshold_s: float) -> None:
        self.threshold = threshold_s
        self.batch_start: float | None = None
        self.step_start = 0.0
        self.steps: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.worst = 0.0

    def after_io_wait(self, timeout: float) -> None:
        self.batch_start = time.perf_counter()
        self.steps.clear()
        self.counts.clear()

    def before_io_wait(self, timeout: float) -> None:
        if self.batch_start is None:
            return
        took = time.perf_counter() - self.batch_start
        self.worst = max(self.worst, took)
        if took >= self.threshold:
            top = sorted(self.steps.items(), key=lambda kv: -kv[1])[:5]
            logger.warning("slow batch %.0f ms (%d steps): %s", took * 1e3,
                           sum(self.counts.values()),
                           ", ".join(f"{name} x{self.counts[name]} {t * 1e3:.0f} ms"
                                     for name, t in top))

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.step_start = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        name = task.name.rsplit(".", 1)[-1]
        self.steps[name] += time.perf_counter() - self.step_start
        self.counts[name] += 1


def main(config_path: str) -> int:
    """`phalanx.cli.node.run_node` (exactly the node `phalanx node run` runs) with the
    trace installed on its `trio.run`."""
    from phalanx.cli.node import run_node

    trace = BatchTrace(float(os.environ.get("PHALANX_LOOP_TRACE_MS", "30")) / 1e3)
    real_run = trio.run

    def traced_run(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("instruments", [trace])
        return real_run(*args, **kwargs)

    trio.run = traced_run  # this process runs one node and nothing else
    code = run_node(config_path)
    logger.warning("worst batch %.0f ms", trace.worst * 1e3)
    return code


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: _loop_trace.py CONFIG (started by attack_handshakes.py --trace-loop)")
    sys.exit(main(sys.argv[1]))
