"""Hop-by-hop medians of a one-client leaderless `latency_trace.py` run, per node.

Usage: ``.venv/bin/python bench/latency_trace.py --protocol leaderless --keep DIR`` then
``.venv/bin/python bench/leaderless_hops.py DIR``.

Lines up, per request (one in flight: a request is the set of `call` events naming it) and
node, the events of the leaderless write path (docs/LEADERLESS.md, "Round 6"), and prints the
median and p90 over requests of each, in ms:

- ``call``: the node's call, from the first node's call of that request (events up to
  50 ms after it count);
- ``step1``: its call to its first persist (client signature, decision, seal);
- ``io1``: the endorsement's persist (journal and WAL fsyncs);
- ``recv1``/``recv2``: the first and second peer `EndorsementBatch` (Q = 3 of 4 needs two),
  from the first call;
- ``step2``: the second peer batch to the next persist (the commit step);
- ``io2``: the commit's persist;
- ``apply``: the apply, from the first call.

Reads trace files only; starts nothing.
"""

from __future__ import annotations

import bisect
import statistics
import sys
from pathlib import Path

Event = tuple[int, str, str]


def _load(path: Path) -> list[Event]:
    events: list[Event] = []
    for line in path.read_text().splitlines():
        parts = line.split(" ", 2)
        if len(parts) >= 2:
            events.append((int(parts[0]), parts[1], parts[2] if len(parts) == 3 else ""))
    events.sort()
    return events


def _first(seq: list[Event], name: str, after: int = 0) -> int | None:
    return next((t for t, e, _ in seq if e == name and t >= after), None)


def _ms(a: int | None, b: int | None) -> float | None:
    return None if a is None or b is None else (b - a) / 1e6


def hops(trace_dir: Path) -> dict[str, list[float]]:
    nodes = {p.stem: _load(p) for p in sorted(trace_dir.glob("*.trace"))}
    calls: dict[str, dict[str, int]] = {}
    for node, events in nodes.items():
        for t, e, detail in events:
            if e == "call":
                calls.setdefault(detail, {}).setdefault(node, t)
    out: dict[str, list[float]] = {}
    for per in calls.values():
        if len(per) < len(nodes):
            continue  # not every node saw it: no attribution
        t0 = min(per.values())
        for node, events in nodes.items():
            times = [t for t, _, _ in events]
            start = bisect.bisect_left(times, per[node])
            seq: list[Event] = []
            for event in events[start:bisect.bisect_right(times, t0 + 50_000_000)]:
                if event[1] == "call" and event[0] != per[node]:
                    break  # the next request
                seq.append(event)
            call = per[node]
            io1 = _first(seq, "io_inline") or _first(seq, "io_start")
            done1 = _first(seq, "io_work", io1 or 0)
            batches = [t for t, e, d in seq if e == "recv" and d == "EndorsementBatch"]
            second = batches[1] if len(batches) > 1 else None
            io2 = (_first(seq, "io_inline", (done1 or 0) + 1)
                   or _first(seq, "io_start", (done1 or 0) + 1))
            figures = {
                "call": _ms(t0, call), "step1": _ms(call, io1), "io1": _ms(io1, done1),
                "recv1": _ms(t0, batches[0] if batches else None), "recv2": _ms(t0, second),
                "step2": _ms(second, io2), "io2": _ms(io2, _first(seq, "io_work", io2 or 0)),
                "apply": _ms(t0, _first(seq, "apply")),
            }
            for name, value in figures.items():
                if value is not None:
                    out.setdefault(f"{node}.{name}", []).append(value)
    return out


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n\n")[1])
    found = hops(Path(sys.argv[1]))
    for key in sorted(found):
        values = sorted(found[key])
        print(f"{key:12} p50 {statistics.median(values):8.3f} ms  "
              f"p90 {values[int(0.9 * (len(values) - 1))]:8.3f} ms  n={len(values)}")


if __name__ == "__main__":
    main()
